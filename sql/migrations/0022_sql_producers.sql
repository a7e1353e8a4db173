-- 0022: enqueue and publish as SQL functions, for producers in any language and
-- for triggers.
--
--   SELECT outbox.enqueue(url => 'https://...', idempotency_key => 'order-42',
--                         json_body => '{"order": 42}');
--   SELECT outbox.publish(event_type => 'order.paid', payload => '{"order": 42}',
--                         idempotency_key => 'order-42-paid');
--
-- Each does in the caller's transaction what the library's Outbox.enqueue and
-- Outbox.publish do (outbox/_core.py, outbox/_message.py, sql/queries/enqueue.sql):
-- the same checks in the same order with the same wording, the same request and
-- event digests (outbox/_digest.py: the same bytes give the same digest), the
-- same idempotency rule, the same ordering-key lock and the same wake-up. A bad
-- argument raises SQLSTATE OB001 with the message "<field>: <problem>" and the
-- field in the error's COLUMN field; a key reused for another request or event
-- raises OB002; a publish that would need an endpoint's JMESPath filter raises
-- OB003 naming the endpoint (filters run in Python, see publish below).
-- Nothing is written when an error is raised.
--
-- What differs from the library, because SQL says it otherwise:
-- - "json" is a keyword from PostgreSQL 16 on (json => ... is a syntax error
--   there), so enqueue's JSON body is "json_body".
-- - A JSON body (and an event's payload) is a jsonb value: it is written
--   compactly, as the library writes JSON, but with jsonb's order of keys
--   (shortest first) and its numbers as jsonb prints them (1e3 is 1000). The
--   digest is of the bytes written, so the same value from Python is the same
--   request only when Python writes the same bytes (keys in that order, no
--   floats): keep a key to one kind of producer (the same key from the same
--   one is a retry, as always).
-- - Limits are the library's defaults: bodies up to 262,144 bytes, 12 attempts
--   for a message and 8 for each published webhook unless max_attempts says.
-- - NULL where a value is required says "must not be null".
-- - The trace context is passed as traceparent and tracestate (W3C), checked.
--
-- The functions are SECURITY DEFINER, with search_path pinned to pg_catalog, this
-- schema and pg_temp (last, so a temporary table cannot stand in for one of
-- ours): they write as the schema's owner, so a role granted EXECUTE on them and
-- USAGE on the schema, and nothing else, can produce messages, and only
-- messages that pass every check. EXECUTE is revoked from PUBLIC; `outbox roles`
-- grants it to the producer role.

-- What this schema's statements splice in as constants (outbox/_queries.py): the
-- advisory lock a waiting dispatcher holds and the channel it listens on, and
-- the seed of the ordering-key locks. Made here, once, from the schema's name.
DO $migration$
DECLARE
    schema_name text := current_schema();
    crc bigint := 4294967295;  -- zlib.crc32 of the name's UTF-8 bytes
    octets bytea := convert_to(current_schema(), 'UTF8');
    i integer;
    j integer;
BEGIN
    FOR i IN 0 .. length(octets) - 1 LOOP
        crc := crc # get_byte(octets, i);
        FOR j IN 1 .. 8 LOOP
            IF crc & 1 = 1 THEN
                crc := (crc >> 1) # 3988292384;  -- 0xEDB88320
            ELSE
                crc := crc >> 1;
            END IF;
        END LOOP;
    END LOOP;
    crc := crc # 4294967295;
    IF crc >= 2147483648 THEN
        crc := crc - 4294967296;
    END IF;
    EXECUTE format(
        $f$CREATE FUNCTION _producer_constants(
               OUT wake_class integer, OUT wake_object integer, OUT channel text,
               OUT ordering_seed integer)
           LANGUAGE sql IMMUTABLE PARALLEL SAFE
           AS $body$ SELECT %s, %s, %L::text, hashtext(%L) $body$$f$,
        1329747713,  -- 0x4F425701, outbox._queries.WAKE_LOCK_CLASS
        crc,
        schema_name || '_ready',
        '"' || replace(schema_name, '"', '""') || '"');
END
$migration$;

-- A text as Python's repr() shows it, as the library's messages quote keys and hosts.
CREATE FUNCTION _repr(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN strpos(value, '''') > 0 AND strpos(value, '"') = 0
                THEN '"' || replace(value, '\', '\\') || '"'
                ELSE '''' || replace(replace(value, '\', '\\'), '''', '\''') || ''''
           END
$$;

-- Refuse a field: SQLSTATE OB001, "<field>: <problem>", the field in COLUMN.
CREATE FUNCTION _refuse(field text, problem text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE = field || ': ' || problem,
                          COLUMN = field;
END
$$;

-- A key (outbox._message.check_key): 1-255 printable ASCII characters, no
-- space at either end.
CREATE FUNCTION _check_key(value text, field text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM _refuse(field, 'must not be null');
    ELSIF value = '' THEN
        PERFORM _refuse(field, 'must not be empty');
    ELSIF length(value) > 255 THEN
        PERFORM _refuse(field, 'is longer than 255 characters');
    ELSIF value !~ '^[ -~]+$' THEN
        PERFORM _refuse(field, 'must contain only printable ASCII characters');
    ELSIF left(value, 1) = ' ' OR right(value, 1) = ' ' THEN
        PERFORM _refuse(field, 'must not start or end with a space');
    END IF;
    RETURN value;
END
$$;

-- The canonical dotted form of an IPv4 address as the C library's inet_aton
-- reads it (one to four parts; each decimal, octal with a leading 0, or hex with
-- 0x; the last part fills the bytes left), or NULL if it is not one.
CREATE FUNCTION _inet_aton(host text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    parts text[] := string_to_array(host, '.');
    part text;
    n integer := cardinality(string_to_array(host, '.'));
    value numeric;
    values numeric[] := '{}';
    digit integer;
    total numeric := 0;
    i integer;
BEGIN
    IF n > 4 THEN
        RETURN NULL;
    END IF;
    FOREACH part IN ARRAY parts LOOP
        IF part ~* '^0x[0-9a-f]+$' THEN
            value := 0;
            FOR i IN 3 .. length(part) LOOP
                digit := strpos('0123456789abcdef', lower(substr(part, i, 1))) - 1;
                value := value * 16 + digit;
                IF value > 4294967295 THEN RETURN NULL; END IF;
            END LOOP;
        ELSIF part ~ '^0[0-7]*$' THEN
            value := 0;
            FOR i IN 2 .. length(part) LOOP
                value := value * 8 + (ascii(substr(part, i, 1)) - 48);
                IF value > 4294967295 THEN RETURN NULL; END IF;
            END LOOP;
        ELSIF part ~ '^[1-9][0-9]*$' THEN
            IF length(part) > 10 THEN RETURN NULL; END IF;
            value := part::numeric;
        ELSE
            RETURN NULL;
        END IF;
        values := values || value;
    END LOOP;
    FOR i IN 1 .. n - 1 LOOP
        IF values[i] > 255 THEN RETURN NULL; END IF;
        total := total * 256 + values[i];
    END LOOP;
    IF values[n] >= 256 ^ (5 - n) THEN
        RETURN NULL;
    END IF;
    total := total * 256 ^ (5 - n) + values[n];
    RETURN concat_ws('.', div(total, 16777216), mod(div(total, 65536), 256),
                     mod(div(total, 256), 256), mod(total, 256));
END
$$;

-- What is wrong with a host as an IPv4 address (outbox._message.ipv4_host_problem),
-- or NULL: only the canonical form of an address is accepted.
CREATE FUNCTION _ipv4_problem(host text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    bare text := CASE WHEN right(host, 1) = '.' THEN left(host, -1) ELSE host END;
    labels text[] := string_to_array(CASE WHEN right(host, 1) = '.' THEN left(host, -1)
                                          ELSE host END, '.');
    canonical text;
BEGIN
    IF strpos(host, ':') > 0 OR labels[cardinality(labels)] !~ '^([0-9]+|0[xX][0-9a-fA-F]*)$' THEN
        RETURN NULL;
    END IF;
    IF host ~ '^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$' THEN
        RETURN NULL;
    END IF;
    canonical := _inet_aton(bare);
    IF canonical IS NULL THEN
        RETURN format('host %s is not a valid IPv4 address', _repr(host));
    END IF;
    RETURN format('host %s is an IPv4 address in a non-canonical form; write it %s',
                  _repr(host), canonical);
END
$$;

-- Whether a bracketed host is an IP address (Python's ipaddress.ip_address, as
-- urllib.parse checks it): 'v4' an IPv4 address, 'v6' an IPv6 one, NULL neither.
CREATE FUNCTION _ip_version(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    bare text := split_part(address, '%', 1);
    scope text := substr(address, length(split_part(address, '%', 1)) + 2);
BEGIN
    IF address ~ '^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$' THEN
        RETURN 'v4';
    END IF;
    IF strpos(address, '%') > 0 AND (scope = '' OR strpos(scope, '%') > 0) THEN
        RETURN NULL;
    END IF;
    -- the hex groups and an optional IPv4 tail, as ipaddress._BaseV6 parses them
    IF bare !~ '^[0-9A-Fa-f:.]+$' OR bare ~ '[0-9A-Fa-f]{5}' OR bare ~ ':::'
       OR strpos(bare, '/') > 0 THEN
        RETURN NULL;
    END IF;
    BEGIN
        IF family(bare::inet) = 6 AND masklen(bare::inet) = 128 THEN
            RETURN 'v6';
        END IF;
    EXCEPTION WHEN invalid_text_representation THEN
        RETURN NULL;
    END;
    RETURN NULL;
END
$$;

-- The destination of an http(s) URL without credentials ("scheme://host:port",
-- outbox._message.url_origin), or OB001 naming "url" (outbox._message.check_url,
-- which reads URLs as Python's urllib.parse.urlsplit does).
CREATE FUNCTION _url_origin(url text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    scheme text := '';
    rest text := url;
    netloc text := '';
    hostinfo text;
    hostname text;
    port text;
    bracketed text;
    colon integer := strpos(url, ':');
    stop integer;
BEGIN
    IF url IS NULL THEN
        PERFORM _refuse('url', 'must not be null');
    ELSIF url = '' THEN
        PERFORM _refuse('url', 'must not be empty');
    ELSIF length(url) > 2048 THEN
        PERFORM _refuse('url', 'is longer than 2048 characters');
    ELSIF url !~ '^[!-~]+$' THEN
        PERFORM _refuse('url', 'must not contain spaces, control or non-ASCII characters');
    END IF;
    IF colon > 1 AND left(url, colon - 1) ~ '^[A-Za-z][A-Za-z0-9+.-]*$' THEN
        scheme := lower(left(url, colon - 1));
        rest := substr(url, colon + 1);
    END IF;
    IF left(rest, 2) = '//' THEN
        netloc := substr(rest, 3);
        stop := length(netloc) + 1;
        IF strpos(netloc, '/') > 0 THEN stop := least(stop, strpos(netloc, '/')); END IF;
        IF strpos(netloc, '?') > 0 THEN stop := least(stop, strpos(netloc, '?')); END IF;
        IF strpos(netloc, '#') > 0 THEN stop := least(stop, strpos(netloc, '#')); END IF;
        netloc := left(netloc, stop - 1);
        IF (strpos(netloc, '[') > 0) <> (strpos(netloc, ']') > 0) THEN
            PERFORM _refuse('url', 'is not a valid URL (Invalid IPv6 URL)');
        END IF;
        IF strpos(netloc, '[') > 0 THEN
            bracketed := split_part(substr(netloc, strpos(netloc, '[') + 1), ']', 1);
            IF left(bracketed, 1) = 'v' THEN
                IF bracketed !~ '^v[a-fA-F0-9]+\..+$' THEN
                    PERFORM _refuse('url', 'is not a valid URL (IPvFuture address is invalid)');
                END IF;
            ELSIF _ip_version(bracketed) IS NULL THEN
                PERFORM _refuse('url', format(
                    'is not a valid URL (%s does not appear to be an IPv4 or IPv6 address)',
                    _repr(bracketed)));
            ELSIF _ip_version(bracketed) = 'v4' THEN
                PERFORM _refuse('url', 'is not a valid URL (An IPv4 address cannot be in brackets)');
            END IF;
        END IF;
    END IF;
    -- urllib's _hostinfo: after the last '@'; a '[' opens a bracketed host
    hostinfo := substr(netloc, length(netloc) - strpos(reverse(netloc), '@') + 2);
    IF strpos(netloc, '@') = 0 THEN
        hostinfo := netloc;
    END IF;
    IF strpos(hostinfo, '[') > 0 THEN
        bracketed := substr(hostinfo, strpos(hostinfo, '[') + 1);
        hostname := split_part(bracketed, ']', 1);
        port := substr(bracketed, length(hostname) + 2);
        port := CASE WHEN strpos(port, ':') > 0 THEN substr(port, strpos(port, ':') + 1) ELSE '' END;
    ELSE
        hostname := split_part(hostinfo, ':', 1);
        port := CASE WHEN strpos(hostinfo, ':') > 0 THEN substr(hostinfo, strpos(hostinfo, ':') + 1)
                     ELSE '' END;
    END IF;
    IF port <> '' THEN
        IF port !~ '^[0-9]+$' THEN
            PERFORM _refuse('url', format(
                'is not a valid URL (Port could not be cast to integer value as %s)', _repr(port)));
        ELSIF (CASE WHEN length(ltrim(port, '0')) > 5 THEN true
                    ELSE COALESCE(NULLIF(ltrim(port, '0'), ''), '0')::integer > 65535 END) THEN
            PERFORM _refuse('url', 'is not a valid URL (Port out of range 0-65535)');
        END IF;
    END IF;
    IF hostname <> '' THEN
        -- urllib lower-cases the host, up to a '%' (a zone)
        hostname := lower(split_part(hostname, '%', 1))
                    || substr(hostname, length(split_part(hostname, '%', 1)) + 1);
    END IF;
    IF scheme NOT IN ('http', 'https') THEN
        PERFORM _refuse('url', 'must use the http or https scheme');
    ELSIF strpos(netloc, '@') > 0 THEN
        PERFORM _refuse('url', 'must not contain credentials (user:password@); use headers');
    ELSIF hostname = '' THEN
        PERFORM _refuse('url', 'must include a host');
    ELSIF strpos(hostname, '%') > 0 THEN
        PERFORM _refuse('url', 'must not percent-encode its host');
    ELSIF _ipv4_problem(hostname) IS NOT NULL THEN
        PERFORM _refuse('url', _ipv4_problem(hostname));
    ELSIF port <> '' AND ltrim(port, '0') = '' THEN
        PERFORM _refuse('url', 'port 0 is not a valid destination');
    ELSIF strpos(url, '#') > 0 THEN
        PERFORM _refuse('url', 'must not contain a fragment (#...); it is never sent');
    END IF;
    RETURN scheme || '://'
           || CASE WHEN strpos(hostname, ':') > 0 THEN '[' || hostname || ']' ELSE hostname END
           || ':'
           || CASE WHEN port <> '' THEN ltrim(port, '0')
                   WHEN scheme = 'https' THEN '443' ELSE '80' END;
END
$$;

-- Headers (outbox._message.check_headers): a JSON object of at most 64 header
-- names to printable values, none of those the outbox sets itself. Checked in
-- jsonb's order of keys (shortest first, then bytewise).
CREATE FUNCTION _check_headers(headers jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    name text;
    value jsonb;
    lower_name text;
    shown text;
    seen text[] := '{}';
    hint text;
BEGIN
    IF headers IS NULL THEN
        RETURN '{}';
    END IF;
    IF jsonb_typeof(headers) <> 'object' THEN
        PERFORM _refuse('headers', 'must be a mapping of header names to values');
    END IF;
    IF (SELECT count(*) FROM jsonb_object_keys(headers)) > 64 THEN
        PERFORM _refuse('headers', 'has more than 64 entries');
    END IF;
    FOR name, value IN SELECT key, e.value FROM jsonb_each(headers) AS e LOOP
        IF name = '' THEN
            PERFORM _refuse('headers', 'header names must be non-empty strings');
        END IF;
        shown := CASE WHEN name ~ '^[ -~]+$' THEN name ELSE _repr(name) END;
        IF length(name) > 256 OR name !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$' THEN
            PERFORM _refuse('headers[' || shown || ']', 'is not a valid HTTP header name');
        END IF;
        lower_name := lower(name);
        IF lower_name IN ('host', 'content-length', 'content-type', 'transfer-encoding',
                          'connection', 'keep-alive', 'proxy-connection', 'te', 'trailer',
                          'upgrade', 'idempotency-key')
           OR starts_with(lower_name, 'webhook-') THEN
            hint := CASE WHEN lower_name = 'content-type' THEN ' (use content_type=)' ELSE '' END;
            PERFORM _refuse('headers[' || name || ']', 'is set by the outbox itself' || hint);
        END IF;
        IF lower_name = ANY (seen) THEN
            PERFORM _refuse('headers[' || name || ']', 'is given more than once');
        END IF;
        seen := seen || lower_name;
        IF jsonb_typeof(value) <> 'string' THEN
            PERFORM _refuse('headers[' || name || ']', 'value must be a string');
        ELSIF length(value #>> '{}') > 8192 THEN
            PERFORM _refuse('headers[' || name || ']', 'value is longer than 8192');
        ELSIF (value #>> '{}') !~ '^[ -~\t]*$' THEN
            PERFORM _refuse('headers[' || name || ']',
                            'value must be printable ASCII (no CR, LF or other control characters)');
        END IF;
    END LOOP;
    RETURN headers;
END
$$;

-- A jsonb value as compact text: jsonb prints a space after each ',' and ':'
-- between values and nowhere else outside strings, so every space outside a
-- string goes (the pattern matches a whole string, kept, or a space, dropped).
CREATE FUNCTION _compact(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT regexp_replace(value::text, '("(?:[^"\\]|\\.)*")| ', '\1', 'g') $$;

-- One field of a digest (outbox._digest._field): its length in 8 bytes, big-endian, then it.
CREATE FUNCTION _digest_field(data bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT int8send(length(data)) || data $$;

-- The W3C trace context, as the library stores the enqueuing span's.
CREATE FUNCTION _trace_context(traceparent text, tracestate text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF traceparent IS NULL THEN
        IF tracestate IS NOT NULL THEN
            PERFORM _refuse('tracestate', 'needs a traceparent');
        END IF;
        RETURN NULL;
    END IF;
    IF traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR left(traceparent, 2) = 'ff'
       OR substr(traceparent, 4, 32) = repeat('0', 32)
       OR substr(traceparent, 37, 16) = repeat('0', 16) THEN
        PERFORM _refuse('traceparent', 'must be a W3C traceparent (00-<trace id>-<span id>-<flags>)');
    END IF;
    IF tracestate IS NOT NULL AND (length(tracestate) > 512 OR tracestate !~ '^[ -~]*$') THEN
        PERFORM _refuse('tracestate', 'must be at most 512 printable ASCII characters');
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object('traceparent', traceparent,
                                                'tracestate', tracestate));
END
$$;

-- Wake the dispatcher waiting for work, if one is (sql/queries/enqueue.sql's {notify}).
CREATE FUNCTION _wake() RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    keys record := _producer_constants();
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(keys.wake_class, keys.wake_object) THEN
        PERFORM pg_notify(keys.channel, '');
    END IF;
END
$$;

-- Take the lock of an ordering key until the transaction ends (enqueue.sql's
-- "ordered"): a second producer of the key waits for the first to commit.
CREATE FUNCTION _lock_ordering_key(ordering_key text) RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(ordering_key, (_producer_constants()).ordering_seed))
    WHERE ordering_key IS NOT NULL
$$;

CREATE FUNCTION enqueue(
    url text,
    idempotency_key text,
    json_body jsonb DEFAULT NULL,
    body bytea DEFAULT NULL,
    content_type text DEFAULT NULL,
    method text DEFAULT 'POST',
    headers jsonb DEFAULT NULL,
    ordering_key text DEFAULT NULL,
    available_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    notify boolean DEFAULT true
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_destination text;
    v_body bytea;
    v_field text;
    v_type text;
    v_method text;
    v_headers jsonb;
    v_digest bytea;
    v_trace jsonb;
    v_id bigint;
    v_new bigint;
    v_found record;
BEGIN
    -- the library's order of checks (outbox._message.build_message)
    v_destination := _url_origin(enqueue.url);
    PERFORM _check_key(enqueue.idempotency_key, 'idempotency_key');
    IF (enqueue.json_body IS NULL) = (enqueue.body IS NULL) THEN
        PERFORM _refuse('json_body', 'give exactly one of json_body or body');
    ELSIF enqueue.json_body IS NOT NULL THEN
        v_body := convert_to(_compact(enqueue.json_body), 'UTF8');
        v_type := 'application/json';
        v_field := 'json_body';
    ELSE
        v_body := enqueue.body;
        v_type := 'application/octet-stream';
        v_field := 'body';
    END IF;
    IF length(v_body) > 262144 THEN
        PERFORM _refuse(v_field, format('is %s bytes, over the limit of 262144 bytes', length(v_body)));
    END IF;
    IF enqueue.content_type IS NOT NULL THEN
        IF length(enqueue.content_type) > 255
           OR enqueue.content_type !~ '^[ -~\t]*$'
           OR enqueue.content_type !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+/[-!#$%&''*+.^_`|~0-9A-Za-z]+(\s*;.*)?$' THEN
            PERFORM _refuse('content_type', 'must be a media type such as application/json');
        END IF;
        v_type := enqueue.content_type;
    END IF;
    v_method := upper(enqueue.method);
    IF enqueue.method IS NULL OR enqueue.method !~ '^[A-Za-z]+$'
       OR v_method NOT IN ('DELETE', 'GET', 'PATCH', 'POST', 'PUT') THEN
        PERFORM _refuse('method', 'must be one of DELETE, GET, PATCH, POST, PUT');
    END IF;
    v_headers := _check_headers(enqueue.headers);
    IF enqueue.ordering_key IS NOT NULL THEN
        PERFORM _check_key(enqueue.ordering_key, 'ordering_key');
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND NOT enqueue.max_attempts BETWEEN 1 AND 1000 THEN
        PERFORM _refuse('max_attempts', 'must be between 1 and 1000');
    END IF;
    IF enqueue.available_at < '2000-01-01 00:00:00+00' THEN
        PERFORM _refuse('available_at', 'must not be before 2000-01-01');
    ELSIF enqueue.available_at > now() + interval '3653 days' THEN
        PERFORM _refuse('available_at', 'must be at most 10 years (3653 days) from now');
    END IF;
    v_trace := _trace_context(enqueue.traceparent, enqueue.tracestate);
    v_digest := sha256(
        convert_to('outbox.request.v1', 'UTF8')
        || _digest_field(convert_to(v_method, 'UTF8'))
        || _digest_field(convert_to(enqueue.url, 'UTF8'))
        || _digest_field(convert_to(v_type, 'UTF8'))
        || _digest_field(v_body)
        || int8send((SELECT count(*) FROM jsonb_object_keys(v_headers)))
        || COALESCE((SELECT string_agg(_digest_field(convert_to(lower(h.key), 'UTF8'))
                                       || _digest_field(convert_to(h.value, 'UTF8')),
                                       ''::bytea ORDER BY lower(h.key) COLLATE "C")
                     FROM jsonb_each_text(v_headers) AS h), ''::bytea));

    IF enqueue.ordering_key IS NOT NULL THEN
        PERFORM _lock_ordering_key(enqueue.ordering_key);
    END IF;
    v_id := nextval('messages_id_seq');
    INSERT INTO message_keys (target, idempotency_key, message_id, digest)
    VALUES (enqueue.url, enqueue.idempotency_key, v_id, v_digest)
    ON CONFLICT ON CONSTRAINT message_keys_pkey DO NOTHING
    RETURNING message_id INTO v_new;
    IF v_new IS NULL THEN
        -- a new statement: in READ COMMITTED it sees the key a concurrent
        -- transaction committed while the insert waited for it
        SELECT k.message_id, k.digest INTO v_found
        FROM message_keys AS k
        WHERE k.target = enqueue.url AND k.idempotency_key = enqueue.idempotency_key;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'OB000', MESSAGE =
                'idempotency key conflicted but no message holds it; '
                'was it removed concurrently by retention?';
        END IF;
        IF v_found.digest IS NOT NULL AND v_found.digest <> v_digest THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002', COLUMN = 'idempotency_key', MESSAGE =
                format('idempotency_key: %s already holds message %s, made for another '
                       'request (method, URL, headers, content type or body); '
                       'a new request needs a new key',
                       _repr(enqueue.idempotency_key), v_found.message_id);
        END IF;
        RETURN v_found.message_id;
    END IF;
    INSERT INTO messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts, available_at,
        trace_context)
    VALUES (
        v_id, enqueue.idempotency_key, enqueue.url, v_destination, NULL, enqueue.url, v_method,
        v_headers, v_body, v_type, NULL, enqueue.ordering_key, 'ready',
        COALESCE(enqueue.max_attempts, 12), COALESCE(enqueue.available_at, now()), v_trace);
    IF enqueue.notify THEN
        PERFORM _wake();
    END IF;
    RETURN v_id;
END
$$;

CREATE FUNCTION publish(
    event_type text,
    payload jsonb,
    idempotency_key text DEFAULT NULL,
    ordering_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    notify boolean DEFAULT true
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    v_key text;
    v_text text;
    v_body bytea;
    v_digest bytea;
    v_trace jsonb;
    v_filtered bigint;
    v_created bigint[];
    v_found record;
BEGIN
    -- the library's order of checks (outbox._core.Outbox._event)
    IF publish.event_type IS NULL THEN
        PERFORM _refuse('event_type', 'must not be null');
    ELSIF publish.event_type !~ '^[!-~]{1,255}$' THEN
        PERFORM _refuse('event_type', 'must be 1-255 printable characters without whitespace');
    ELSIF strpos(publish.event_type, '*') > 0 THEN
        PERFORM _refuse('event_type', 'must not contain ''*''');
    END IF;
    IF publish.idempotency_key IS NOT NULL THEN
        PERFORM _check_key(publish.idempotency_key, 'idempotency_key');
        IF length(publish.idempotency_key) > 200 THEN
            PERFORM _refuse('idempotency_key', 'is longer than 200 characters (events)');
        END IF;
    END IF;
    IF publish.payload IS NULL OR jsonb_typeof(publish.payload) = 'null' THEN
        PERFORM _refuse('payload', 'must not be null');
    END IF;
    v_text := _compact(publish.payload);
    -- at most 128 levels of objects and arrays (outbox._storable.MAX_JSON_DEPTH);
    -- only a text with that many brackets can nest so deep
    IF length(v_text) - length(translate(v_text, '[{', '')) >= 128
       AND jsonb_path_exists(publish.payload,
                             'strict $.**{128} ? (@.type() == "array" || @.type() == "object")') THEN
        PERFORM _refuse('payload', 'nests deeper than 128 levels (objects and arrays)');
    END IF;
    v_body := convert_to(
        '{"type":' || to_jsonb(publish.event_type)::text
        || ',"timestamp":"'
        || to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"+00:00"')
        || '","data":' || v_text || '}', 'UTF8');
    IF length(v_body) > 262144 THEN
        PERFORM _refuse('payload', format('is %s bytes, over the limit of 262144 bytes',
                                          length(v_body)));
    END IF;
    IF publish.ordering_key IS NOT NULL THEN
        PERFORM _check_key(publish.ordering_key, 'ordering_key');
    END IF;
    IF publish.max_attempts IS NOT NULL AND NOT publish.max_attempts BETWEEN 1 AND 1000 THEN
        PERFORM _refuse('max_attempts', 'must be between 1 and 1000');
    END IF;
    v_trace := _trace_context(publish.traceparent, publish.tracestate);
    v_key := COALESCE(publish.idempotency_key, 'evt_' || replace(gen_random_uuid()::text, '-', ''));
    v_digest := sha256(convert_to('outbox.event.v1', 'UTF8')
                       || _digest_field(convert_to(publish.event_type, 'UTF8'))
                       || _digest_field(convert_to(v_text, 'UTF8')));

    IF publish.ordering_key IS NOT NULL THEN
        PERFORM _lock_ordering_key(publish.ordering_key);
    END IF;
    -- sql/queries/enqueue.sql's publish, but for filters: an endpoint's JMESPath
    -- filter runs in Python, so a subscribed endpoint with one refuses the event
    -- (OB003) rather than have it sent unjudged or silently left out
    WITH subscribed AS (
        SELECT e.id, e.filter,
               'endpoint:' || e.id AS target,
               v_key || ':' || e.id AS idempotency_key
        FROM endpoints AS e
        WHERE e.enabled
          AND (cardinality(e.event_types) = 0
               OR publish.event_type = ANY (e.event_types)
               OR EXISTS (
                    SELECT 1 FROM unnest(e.event_types) AS pattern
                    WHERE right(pattern, 2) = '.*'
                      AND starts_with(publish.event_type, left(pattern, -1))))
    ), filtered AS (
        SELECT min(id) AS id FROM subscribed WHERE filter IS NOT NULL
    ), planned AS (
        SELECT s.id, s.target, s.idempotency_key, k.message_id IS NULL AS fresh,
               COALESCE(k.message_id, nextval('messages_id_seq')) AS message_id
        FROM subscribed AS s
        -- a lookup of the key per endpoint: a join the planner may flatten
        -- becomes, in the generic plan plpgsql keeps, a scan of every key
        LEFT JOIN LATERAL (
            SELECT k.message_id FROM message_keys AS k
            WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key
            LIMIT 1
        ) AS k ON true
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
    ), new_event AS (
        INSERT INTO events (event_key, event_type, digest, message_ids)
        SELECT v_key, publish.event_type, v_digest,
               ARRAY(SELECT message_id FROM planned ORDER BY message_id)
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
        ON CONFLICT (event_key) DO NOTHING
        RETURNING message_ids
    ), new_key AS (
        INSERT INTO message_keys (target, idempotency_key, message_id)
        SELECT target, idempotency_key, message_id
        FROM planned
        WHERE fresh AND EXISTS (SELECT FROM new_event)
        ORDER BY id
        ON CONFLICT (target, idempotency_key) DO NOTHING
        RETURNING message_id
    ), new_message AS (
        INSERT INTO messages (
            id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
            content_type, event_type, ordering_key, state, max_attempts, trace_context
        )
        SELECT p.message_id, p.idempotency_key, p.target, p.target, p.id, NULL, 'POST',
               '{}', v_body, 'application/json', publish.event_type, publish.ordering_key,
               'ready', COALESCE(publish.max_attempts, 8), v_trace
        FROM new_key AS k
        JOIN planned AS p USING (message_id)
    )
    SELECT (SELECT id FROM filtered), (SELECT message_ids FROM new_event)
    INTO v_filtered, v_created;
    IF v_filtered IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003', COLUMN = 'event_type', MESSAGE = format(
            'event_type: endpoint %s subscribes to %s with a payload filter, which only '
            'the Python library evaluates; publish this event from Python, or remove '
            'the endpoint''s filter', v_filtered, _repr(publish.event_type));
    END IF;
    IF v_created IS NOT NULL THEN
        IF publish.notify AND cardinality(v_created) > 0 THEN
            PERFORM _wake();
        END IF;
        RETURN v_created;
    END IF;
    -- the key was published before (or by a transaction that committed while
    -- this one waited): a new statement sees its event
    SELECT e.message_ids, e.digest INTO v_found FROM events AS e WHERE e.event_key = v_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'OB000', MESSAGE =
            'event key conflicted but no event holds it; '
            'was it removed concurrently by retention?';
    END IF;
    IF v_found.digest <> v_digest THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002', COLUMN = 'idempotency_key', MESSAGE = format(
            'idempotency_key: event %s was published before with another event type or '
            'payload; a new event needs a new key', _repr(v_key));
    END IF;
    RETURN ARRAY(SELECT unnest(v_found.message_ids) ORDER BY 1);
END
$$;

-- EXECUTE for no one until `outbox roles` grants it. enqueue and publish run
-- with the search path pinned; the helpers, which only they may call, run in
-- theirs: a function with a search path of its own is never inlined, and costs
-- a change of search path at each call (on PostgreSQL 15, 23 µs a digest field).
DO $migration$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('enqueue', 'publish', '_producer_constants', '_repr', '_refuse',
                            '_check_key', '_inet_aton', '_ipv4_problem', '_ip_version',
                            '_url_origin', '_check_headers', '_compact', '_digest_field',
                            '_trace_context', '_wake', '_lock_ordering_key')
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', routine);
    END LOOP;
    EXECUTE format('ALTER FUNCTION enqueue SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION publish SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END
$migration$;
