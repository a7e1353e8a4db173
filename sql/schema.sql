-- The schema "outbox" as a fresh `outbox migrate` leaves it (migrations 0001 to
-- 0034), with the grants of
--     outbox roles --producer outbox_producer --dispatcher outbox_dispatcher \
--         --operator outbox_operator
--
-- For reading, not for running: `outbox migrate` makes and upgrades the schema.
-- Written by `python -m tests.schema_file write` from pg_dump's text of a freshly
-- migrated database (objects by kind, then by name); a test fails when it is not
-- what the migrations make.
--
-- The history (delivered, attempts) is partitioned by day. The migration makes
-- the partitions of today to three days ahead, and the dispatchers make each
-- next one and drop those past the retention period (history_extend,
-- history_drop): those daily partitions (delivered_pYYYYMMDD,
-- attempts_pYYYYMMDD) are left out here; the partitioned tables and their
-- DEFAULT partitions are shown.

-- ============================================================================
-- The schema
-- ============================================================================

-- schema outbox
CREATE SCHEMA outbox;

-- ============================================================================
-- Domains
-- ============================================================================

-- domain attempt_budget
CREATE DOMAIN outbox.attempt_budget AS integer
	CONSTRAINT attempt_budget_check CHECK ((VALUE > 0));

-- domain attempt_count
CREATE DOMAIN outbox.attempt_count AS integer
	CONSTRAINT attempt_count_check CHECK ((VALUE >= 0));

-- domain attempt_number
CREATE DOMAIN outbox.attempt_number AS integer
	CONSTRAINT attempt_number_check CHECK ((VALUE > 0));

-- domain concurrency_cap
CREATE DOMAIN outbox.concurrency_cap AS integer
	CONSTRAINT concurrency_cap_check CHECK ((VALUE > 0));

-- domain failure_count
CREATE DOMAIN outbox.failure_count AS integer
	CONSTRAINT failure_count_check CHECK ((VALUE >= 0));

-- domain message_state
CREATE DOMAIN outbox.message_state AS text
	CONSTRAINT message_state_check CHECK ((VALUE = ANY (ARRAY['ready'::text, 'running'::text, 'paused'::text, 'dead'::text])));

-- domain rate_limit
CREATE DOMAIN outbox.rate_limit AS double precision
	CONSTRAINT rate_limit_check CHECK ((VALUE > (0)::double precision));

-- domain retry_schedule
CREATE DOMAIN outbox.retry_schedule AS double precision[]
	CONSTRAINT retry_schedule_check CHECK (((array_ndims(VALUE) = 1) AND ((cardinality(VALUE) >= 1) AND (cardinality(VALUE) <= 100)) AND (array_position(VALUE, NULL::double precision) IS NULL) AND ((0)::double precision < ALL (VALUE)) AND ((604800)::double precision >= ALL (VALUE))));

-- domain slot_number
CREATE DOMAIN outbox.slot_number AS integer
	CONSTRAINT slot_number_check CHECK ((VALUE > 0));

-- ============================================================================
-- Functions
-- ============================================================================

-- function _alert(text, text, jsonb, bigint)
CREATE FUNCTION outbox._alert(event_type text, event_key text, data jsonb, passed_over bigint) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_text text := _compact(data);
    v_fanned record;
BEGIN
    v_fanned := _fan_out(event_type, event_key, _event_digest(event_type, v_text),
                         _envelope(event_type, v_text), 0, NULL, 8, NULL, passed_over, false);
    IF cardinality(v_fanned.created_ids) > 0 THEN
        PERFORM _wake();
    END IF;
    RETURN COALESCE(v_fanned.created_ids, '{}');
END
$$;

-- function _alert_endpoint(text)
CREATE FUNCTION outbox._alert_endpoint(destination text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
    SELECT CASE WHEN destination ~ '^endpoint:[0-9]{1,18}$' THEN substr(destination, 10)::bigint END
$_$;

-- function _alert_key_part(text)
CREATE FUNCTION outbox._alert_key_part(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
    SELECT CASE WHEN length(value) <= 100 AND value ~ '^[!-~]+$' THEN value
                ELSE 'sha256:' || left(encode(sha256(convert_to(value, 'UTF8')), 'hex'), 32)
           END
$_$;

-- function _alert_tenant(bigint)
CREATE FUNCTION outbox._alert_tenant(endpoint_id bigint) RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT t.external_id FROM endpoints AS e JOIN tenants AS t ON t.id = e.tenant_id
    WHERE e.id = endpoint_id
$$;

-- function _alert_time(timestamp with time zone)
CREATE FUNCTION outbox._alert_time(at timestamp with time zone) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$ SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;

-- function _alerts_wanted()
CREATE FUNCTION outbox._alerts_wanted() RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT FROM endpoints AS e
                   WHERE e.tenant_id IS NULL AND e.enabled AND _takes_alerts(e.event_types))
$$;

-- function _check_headers(jsonb)
CREATE FUNCTION outbox._check_headers(headers jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _check_key(text, text)
CREATE FUNCTION outbox._check_key(value text, field text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _compact(jsonb)
CREATE FUNCTION outbox._compact(value jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$ SELECT regexp_replace(value::text, '("(?:[^"\\]|\\.)*")| ', '\1', 'g') $$;

-- function _digest_field(bytea)
CREATE FUNCTION outbox._digest_field(data bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$ SELECT int8send(length(data)) || data $$;

-- function _envelope(text, text)
CREATE FUNCTION outbox._envelope(event_type text, data text) RETURNS bytea
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT convert_to(
        '{"type":' || to_jsonb(event_type)::text
        || ',"timestamp":"'
        || to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"+00:00"')
        || '","data":' || data || '}', 'UTF8')
$$;

-- function _event_digest(text, text)
CREATE FUNCTION outbox._event_digest(event_type text, data text) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT sha256(convert_to('outbox.event.v1', 'UTF8')
                  || _digest_field(convert_to(event_type, 'UTF8'))
                  || _digest_field(convert_to(data, 'UTF8')))
$$;

-- function _fan_out(text, text, bytea, bytea, bigint, text, integer, jsonb, bigint, boolean)
CREATE FUNCTION outbox._fan_out(event_type text, event_key text, digest bytea, body bytea, tenant_id bigint, ordering_key text, max_attempts integer, trace_context jsonb, passed_over bigint, record_empty boolean, OUT created_ids bigint[], OUT filtered_endpoint bigint) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    WITH subscribed AS (
        SELECT e.id, e.filter,
               'endpoint:' || e.id AS target,
               _fan_out.event_key || ':' || e.id AS idempotency_key
        FROM endpoints AS e
        WHERE e.enabled
          AND COALESCE(e.tenant_id, 0) = _fan_out.tenant_id
          AND e.id IS DISTINCT FROM _fan_out.passed_over
          AND ((cardinality(e.event_types) = 0 AND NOT starts_with(_fan_out.event_type, 'outbox.'))
               OR _fan_out.event_type = ANY (e.event_types)
               OR EXISTS (
                    SELECT 1 FROM unnest(e.event_types) AS pattern
                    WHERE right(pattern, 2) = '.*'
                      AND starts_with(_fan_out.event_type, left(pattern, -1))))
    ), filtered AS (
        SELECT min(id) AS id FROM subscribed
        WHERE filter IS NOT NULL AND NOT starts_with(_fan_out.event_type, 'outbox.')
    ), planned AS (
        SELECT s.id, s.target, s.idempotency_key, k.message_id IS NULL AS fresh,
               COALESCE(k.message_id, nextval('messages_id_seq')) AS message_id
        FROM subscribed AS s
        -- a lookup of the key per endpoint: a join the planner may flatten
        -- becomes, in the generic plan plpgsql keeps, a scan of every key
        LEFT JOIN LATERAL (
            SELECT k.message_id FROM message_keys AS k
            WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key
            UNION ALL
            SELECT k.message_id FROM message_keys_old AS k
            WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key
            LIMIT 1
        ) AS k ON true
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
    ), new_event AS (
        INSERT INTO events (tenant_id, event_key, event_type, digest, message_ids)
        SELECT _fan_out.tenant_id, _fan_out.event_key, _fan_out.event_type, _fan_out.digest,
               ARRAY(SELECT message_id FROM planned ORDER BY message_id)
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
          AND (_fan_out.record_empty OR EXISTS (SELECT FROM planned))
          AND (pg_catalog.current_setting('transaction_isolation') = 'read committed'
               OR NOT _keys_moved())
          AND NOT EXISTS (SELECT FROM events_old AS o
                          WHERE o.tenant_id = _fan_out.tenant_id
                            AND o.event_key = _fan_out.event_key)
        ON CONFLICT (tenant_id, event_key) DO NOTHING
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
               '{}', _fan_out.body, 'application/json', _fan_out.event_type,
               _fan_out.ordering_key, 'ready', _fan_out.max_attempts, _fan_out.trace_context
        FROM new_key AS k
        JOIN planned AS p USING (message_id)
    )
    SELECT (SELECT message_ids FROM new_event), (SELECT id FROM filtered)
    INTO created_ids, filtered_endpoint;
END
$$;

-- function _grants_copy(regclass, regclass)
CREATE FUNCTION outbox._grants_copy(source regclass, target regclass) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN
        SELECT a.privilege_type, a.grantee, NULL AS attname
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = source AND a.grantee <> c.relowner
        UNION ALL
        SELECT a.privilege_type, a.grantee, t.attname
        FROM pg_attribute AS t, aclexplode(t.attacl) AS a
        WHERE t.attrelid = source AND t.attnum > 0 AND NOT t.attisdropped
    LOOP
        EXECUTE format('GRANT %s %s ON %s TO %s', v_grant.privilege_type,
                       CASE WHEN v_grant.attname IS NOT NULL
                            THEN format('(%I)', v_grant.attname) ELSE '' END,
                       target,
                       CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC'
                            ELSE CAST(CAST(v_grant.grantee AS regrole) AS text) END);
    END LOOP;
END
$$;

-- function _history_partition_add(text, timestamp with time zone, timestamp with time zone)
CREATE FUNCTION outbox._history_partition_add(parent text, lower timestamp with time zone, upper timestamp with time zone) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    v_name text := parent || '_p' || to_char(lower AT TIME ZONE 'UTC', 'YYYYMMDD')
                   || CASE WHEN lower = date_trunc('day', lower, 'UTC') THEN ''
                           ELSE to_char(lower AT TIME ZONE 'UTC', '"_"HH24') END;
    v_key text := CASE parent WHEN 'delivered' THEN 'completed_at' ELSE 'started_at' END;
    v_pkey text := CASE parent WHEN 'delivered' THEN 'id' ELSE 'message_id, attempt' END;
    v_default text;
    v_stray boolean := false;
    -- named in full: the search path of a caller starts with pg_catalog
    v_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c
                      WHERE c.oid = CAST(parent AS regclass));
BEGIN
    SELECT h.partition INTO v_default
    FROM history_partitions() AS h
    WHERE h.parent = _history_partition_add.parent AND h.is_default;
    IF v_default IS NOT NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= $1 AND %I < $2)',
                       v_default, v_key, v_key)
            INTO v_stray USING lower, upper;
    END IF;
    IF v_stray THEN
        -- the rare path: held aside, then written back through the parent
        EXECUTE format('CREATE TEMPORARY TABLE _history_moving (LIKE %I) ON COMMIT DROP',
                       parent);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *)'
                       ' INSERT INTO _history_moving SELECT * FROM moved',
                       v_default, v_key, v_key)
            USING lower, upper;
    END IF;
    EXECUTE format('CREATE TABLE %s.%I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                   v_schema, v_name, parent, lower, upper);
    EXECUTE format('ALTER TABLE %s.%I ADD PRIMARY KEY (%s)', v_schema, v_name, v_pkey);
    IF v_stray THEN
        EXECUTE format('INSERT INTO %I SELECT * FROM _history_moving', parent);
        DROP TABLE _history_moving;
    END IF;
    RETURN v_name;
END
$_$;

-- function _inet_aton(text)
CREATE FUNCTION outbox._inet_aton(host text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _ip_version(text)
CREATE FUNCTION outbox._ip_version(address text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _ipv4_problem(text)
CREATE FUNCTION outbox._ipv4_problem(host text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _keys_moved()
CREATE FUNCTION outbox._keys_moved() RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF (SELECT g.keys FROM key_generation AS g)
       IS DISTINCT FROM CAST(to_regclass('message_keys') AS oid) THEN
        RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE =
            'the generation of idempotency keys turned since this transaction''s '
            'snapshot; try the transaction again';
    END IF;
    RETURN false;
END
$$;

-- function _lock_ordering_key(text)
CREATE FUNCTION outbox._lock_ordering_key(ordering_key text) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(ordering_key, (_producer_constants()).ordering_seed))
    WHERE ordering_key IS NOT NULL
$$;

-- function _producer_constants()
CREATE FUNCTION outbox._producer_constants(OUT wake_class integer, OUT wake_object integer, OUT channel text, OUT ordering_seed integer) RETURNS record
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$ SELECT 1329747713, 1793578352, 'outbox_ready'::text, hashtext('"outbox"') $$;

-- function _refuse(text, text)
CREATE FUNCTION outbox._refuse(field text, problem text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE = field || ': ' || problem,
                          COLUMN = field;
END
$$;

-- function _repr(text)
CREATE FUNCTION outbox._repr(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT CASE WHEN strpos(value, '''') > 0 AND strpos(value, '"') = 0
                THEN '"' || replace(value, '\', '\\') || '"'
                ELSE '''' || replace(replace(value, '\', '\\'), '''', '\''') || ''''
           END
$$;

-- function _retention_floor(interval)
CREATE FUNCTION outbox._retention_floor(retention interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF retention IS NULL OR retention < interval '1 hour' THEN
        RAISE EXCEPTION 'retention must be at least an hour, got %', retention
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- function _takes_alerts(text[])
CREATE FUNCTION outbox._takes_alerts(event_types text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$ SELECT EXISTS (SELECT FROM unnest(event_types) AS t WHERE starts_with(t, 'outbox.')) $$;

-- function _trace_context(text, text)
CREATE FUNCTION outbox._trace_context(traceparent text, tracestate text) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _url_origin(text)
CREATE FUNCTION outbox._url_origin(url text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
$_$;

-- function _wake()
CREATE FUNCTION outbox._wake() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    keys record := _producer_constants();
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(keys.wake_class, keys.wake_object) THEN
        PERFORM pg_notify(keys.channel, '');
    END IF;
END
$$;

-- function alert_breaker()
CREATE FUNCTION outbox.alert_breaker() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_row destination_health := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    v_endpoint bigint := _alert_endpoint(v_row.destination);
    v_type text := CASE WHEN TG_OP = 'DELETE' THEN 'outbox.breaker.closed'
                        ELSE 'outbox.breaker.opened' END;
BEGIN
    IF _alerts_wanted() THEN
        PERFORM _alert(v_type,
                       v_type || ':' || _alert_key_part(v_row.destination) || ':'
                       || _alert_time(v_row.opened_at),
                       jsonb_build_object(
                           'destination', v_row.destination,
                           'endpoint_id', v_endpoint,
                           'tenant', _alert_tenant(v_endpoint),
                           'reason', left(v_row.reason, 500),
                           'opened_at', _alert_time(v_row.opened_at))
                       || CASE WHEN TG_OP = 'DELETE' THEN jsonb_build_object(
                               'failed_probes', v_row.failed_probes,
                               'closed_at', _alert_time(now()))
                          ELSE jsonb_build_object(
                               'next_probe_at', _alert_time(v_row.blocked_until)) END,
                       v_endpoint);
    END IF;
    RETURN NULL;
END
$$;

-- function alert_endpoint_disabled()
CREATE FUNCTION outbox.alert_endpoint_disabled() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_at timestamptz := COALESCE(NEW.disabled_at, now());
    v_tenant text := _alert_tenant(NEW.id);
BEGIN
    IF _alerts_wanted() THEN
        PERFORM _alert('outbox.endpoint.disabled',
                       'outbox.endpoint.disabled:' || NEW.id || ':'
                           || _alert_time(date_trunc('hour', v_at, 'UTC')),
                       jsonb_build_object(
                           'endpoint_id', NEW.id,
                           'tenant', v_tenant,
                           'description', CASE WHEN NEW.tenant_id IS NULL
                                               THEN left(NEW.description, 200) END,
                           -- scheme, host and port: a URL's path may hold a token
                           'origin', substring(NEW.url FROM '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*'),
                           'reason', left(NEW.disabled_reason, 200),
                           'failure_streak', NEW.failure_streak,
                           'failing_since', _alert_time(NEW.failing_since),
                           'last_success_at', _alert_time(NEW.last_success_at),
                           'disabled_at', _alert_time(v_at)),
                       NEW.id);
    END IF;
    RETURN NULL;
END
$$;

-- function alert_lag(double precision, double precision, text)
CREATE FUNCTION outbox.alert_lag(oldest_s double precision, threshold_s double precision, destination text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_active boolean;
    v_was record;
    v_since timestamptz;
    v_type text;
BEGIN
    IF oldest_s IS NULL OR threshold_s IS NULL OR NOT threshold_s > 0 THEN
        RETURN NULL;
    ELSIF oldest_s > threshold_s THEN
        v_active := true;
    ELSIF oldest_s <= threshold_s / 2 THEN
        v_active := false;
    ELSE
        RETURN NULL;
    END IF;
    SELECT c.active, c.since INTO v_was FROM alert_conditions AS c WHERE c.condition = 'lag';
    IF COALESCE(v_was.active, false) = v_active THEN
        RETURN NULL;  -- as it was: the usual answer, which writes nothing
    END IF;
    INSERT INTO alert_conditions AS c (condition, active, since)
    VALUES ('lag', v_active, now())
    ON CONFLICT (condition) DO UPDATE SET active = excluded.active, since = excluded.since
    WHERE c.active <> excluded.active
    RETURNING c.since INTO v_since;
    IF NOT FOUND THEN
        RETURN NULL;  -- another dispatcher changed it first
    END IF;
    v_type := CASE WHEN v_active THEN 'outbox.lag.exceeded' ELSE 'outbox.lag.recovered' END;
    IF _alerts_wanted() THEN
        PERFORM _alert(v_type, v_type || ':' || _alert_time(v_since),
                       jsonb_build_object(
                           'oldest_due_seconds', round(oldest_s::numeric, 3),
                           'threshold_seconds', threshold_s)
                       || CASE WHEN v_active THEN jsonb_build_object(
                               'destination', destination,
                               'exceeded_at', _alert_time(v_since))
                          ELSE jsonb_build_object(
                               'exceeded_at', _alert_time(v_was.since),
                               'recovered_at', _alert_time(v_since)) END,
                       NULL);
    END IF;
    RETURN CASE WHEN v_active THEN 'exceeded' ELSE 'recovered' END;
END
$$;

-- function alert_message_dead()
CREATE FUNCTION outbox.alert_message_dead() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    -- a deleted endpoint's message keeps its id in its target
    v_endpoint bigint := COALESCE(NEW.endpoint_id, _alert_endpoint(NEW.target));
BEGIN
    IF _alerts_wanted() THEN
        PERFORM _alert('outbox.message.dead',
                       'outbox.message.dead:' || NEW.id || ':' || NEW.attempts,
                       jsonb_build_object(
                           'message_id', NEW.id,
                           'idempotency_key', NEW.idempotency_key,
                           'event_type', NEW.event_type,
                           'endpoint_id', v_endpoint,
                           'tenant', _alert_tenant(NEW.endpoint_id),
                           'destination', NEW.destination,
                           'attempts', NEW.attempts,
                           'max_attempts', NEW.max_attempts,
                           'last_status', NEW.last_status,
                           -- the class of its last attempt, recorded by the
                           -- same statement when that statement made it
                           'error_class', (SELECT a.error_class FROM attempts AS a
                                           WHERE a.message_id = NEW.id
                                             AND a.attempt = NEW.attempts),
                           'last_error', left(NEW.last_error, 500),
                           'created_at', _alert_time(NEW.created_at),
                           'dead_at', _alert_time(COALESCE(NEW.completed_at, now()))),
                       v_endpoint);
    END IF;
    RETURN NULL;
END
$$;

-- function alert_unknown_key(text, bigint, text)
CREATE FUNCTION outbox.alert_unknown_key(key_id text, endpoint_id bigint, dispatcher text DEFAULT NULL::text) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_hour text := to_char(date_trunc('hour', now() AT TIME ZONE 'UTC'), 'YYYY-MM-DD"T"HH24":00Z"');
BEGIN
    IF key_id IS NULL OR NOT _alerts_wanted() THEN
        RETURN '{}';
    END IF;
    RETURN _alert('outbox.secrets.unknown_key',
                  'outbox.secrets.unknown_key:' || _alert_key_part(key_id) || ':' || v_hour,
                  jsonb_build_object(
                      'key_id', left(key_id, 100),
                      'endpoint_id', endpoint_id,
                      'tenant', _alert_tenant(endpoint_id),
                      'dispatcher', left(dispatcher, 200),
                      'hour', v_hour),
                  endpoint_id);
END
$$;

-- function endpoint_enable_check()
CREATE FUNCTION outbox.endpoint_enable_check() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF NOT has_column_privilege(TG_RELID, 'url', 'UPDATE') THEN
        RAISE EXCEPTION 'permission denied to enable endpoint %', NEW.id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only a role that may change an endpoint''s url may enable it.';
    END IF;
    RETURN NEW;
END
$$;

-- function enqueue(text, text, jsonb, bytea, text, text, jsonb, text, timestamp with time zone, integer, text, text, boolean)
CREATE FUNCTION outbox.enqueue(url text, idempotency_key text, json_body jsonb DEFAULT NULL::jsonb, body bytea DEFAULT NULL::bytea, content_type text DEFAULT NULL::text, method text DEFAULT 'POST'::text, headers jsonb DEFAULT NULL::jsonb, ordering_key text DEFAULT NULL::text, available_at timestamp with time zone DEFAULT NULL::timestamp with time zone, max_attempts integer DEFAULT NULL::integer, traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text, notify boolean DEFAULT true) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
    SELECT enqueue.url, enqueue.idempotency_key, v_id, v_digest
    WHERE (pg_catalog.current_setting('transaction_isolation') = 'read committed'
           OR NOT _keys_moved())
      AND NOT EXISTS (SELECT FROM message_keys_old AS k
                      WHERE k.target = enqueue.url
                        AND k.idempotency_key = enqueue.idempotency_key)
    ON CONFLICT ON CONSTRAINT message_keys_pkey DO NOTHING
    RETURNING message_id INTO v_new;
    IF v_new IS NULL THEN
        -- a new statement: in READ COMMITTED it sees the key a concurrent
        -- transaction committed while the insert waited for it
        SELECT k.message_id, k.digest INTO v_found
        FROM (SELECT * FROM message_keys UNION ALL SELECT * FROM message_keys_old) AS k
        WHERE k.target = enqueue.url AND k.idempotency_key = enqueue.idempotency_key
        LIMIT 1;
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
$_$;

-- function expire_payloads(integer)
CREATE FUNCTION outbox.expire_payloads(batch integer) RETURNS TABLE(rule_id bigint, erased integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_rule record;
    v_cutoff timestamptz;
    v_ids bigint[];
    v_last timestamptz;
    v_count integer;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch: must be a positive count' USING ERRCODE = '22023';
    END IF;
    FOR v_rule IN
        SELECT r.id, r.endpoint_id, r.event_type, r.payload_retention_s, r.erased_until
        FROM retention_rules AS r
        ORDER BY r.id
        FOR UPDATE SKIP LOCKED
    LOOP
        v_cutoff := now() - make_interval(secs => v_rule.payload_retention_s);
        IF v_rule.endpoint_id IS NOT NULL THEN
            SELECT array_agg(c.id), max(c.completed_at) INTO v_ids, v_last
            FROM (SELECT d.id, d.completed_at
                  FROM delivered AS d
                  WHERE d.endpoint_id = v_rule.endpoint_id
                    AND d.completed_at >= COALESCE(v_rule.erased_until, '-infinity')
                    AND d.completed_at < v_cutoff
                    AND d.expunged_at IS NULL
                  ORDER BY d.completed_at
                  LIMIT batch) AS c;
        ELSE
            SELECT array_agg(c.id), max(c.completed_at) INTO v_ids, v_last
            FROM (SELECT d.id, d.completed_at
                  FROM delivered AS d
                  WHERE d.completed_at >= COALESCE(v_rule.erased_until, '-infinity')
                    AND d.completed_at < v_cutoff
                    AND d.event_type = v_rule.event_type
                    AND d.expunged_at IS NULL
                  ORDER BY d.completed_at
                  LIMIT batch) AS c;
        END IF;
        v_count := COALESCE(cardinality(v_ids), 0);
        IF v_count > 0 THEN
            UPDATE delivered AS d
            SET body = convert_to('{"expunged":true}', 'UTF8'), headers = '{}',
                expunged_at = now()
            WHERE d.id = ANY (v_ids) AND d.expunged_at IS NULL;
            UPDATE attempts AS a
            SET response_excerpt = NULL
            WHERE a.message_id = ANY (v_ids) AND a.response_excerpt IS NOT NULL;
            INSERT INTO expunges (scope, selector, messages, history, cancelled, running)
            VALUES ('retention',
                    jsonb_strip_nulls(jsonb_build_object(
                        'rule_id', v_rule.id,
                        'endpoint_id', v_rule.endpoint_id,
                        'event_type', v_rule.event_type,
                        'payload_retention_s', v_rule.payload_retention_s)),
                    0, v_count, 0, 0);
        END IF;
        -- a full batch may have left rows of its last instant: start there next
        -- time (>=); a short one read everything up to the cutoff
        UPDATE retention_rules AS r
        SET erased_until = CASE WHEN v_count >= batch THEN v_last ELSE v_cutoff END
        WHERE r.id = v_rule.id;
        rule_id := v_rule.id;
        erased := v_count;
        RETURN NEXT;
    END LOOP;
END
$$;

-- function history_drop(text, interval)
CREATE FUNCTION outbox.history_drop(partition text, retention interval) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    PERFORM _retention_floor(retention);
    PERFORM 1 FROM history_partitions() AS h
    WHERE h.partition = history_drop.partition AND NOT h.is_default
      AND h.upper <= now() - retention;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %s.%I',
                   (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c
                    WHERE c.oid = CAST('delivered' AS regclass)),
                   partition);
    RETURN true;
END
$$;

-- function history_extend(interval, text, integer)
CREATE FUNCTION outbox.history_extend(ahead interval, step text DEFAULT 'day'::text, most integer DEFAULT 4) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_parent text;
    v_lower timestamptz;
    v_upper timestamptz;
BEGIN
    IF step IS NULL OR step NOT IN ('hour', 'day', 'week') THEN
        RAISE EXCEPTION 'step must be hour, day or week, not %', step
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ahead IS NULL OR ahead < interval '0' THEN
        RAISE EXCEPTION 'ahead must be a positive interval' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('outbox.history ' || CAST('delivered' AS regclass)::oid, 0)) THEN
        RETURN;
    END IF;
    FOREACH v_parent IN ARRAY ARRAY['delivered', 'attempts'] LOOP
        SELECT max(h.upper) INTO v_lower
        FROM history_partitions() AS h WHERE h.parent = v_parent;
        v_lower := COALESCE(v_lower, date_trunc(step, now(), 'UTC'));
        WHILE v_lower < now() + ahead AND most > 0 LOOP
            v_upper := date_trunc(step, v_lower, 'UTC') + CAST('1 ' || step AS interval);
            RETURN NEXT _history_partition_add(v_parent, v_lower, v_upper);
            v_lower := v_upper;
            most := most - 1;
        END LOOP;
    END LOOP;
END
$$;

-- function history_partitions()
CREATE FUNCTION outbox.history_partitions() RETURNS TABLE(parent text, partition text, lower timestamp with time zone, upper timestamp with time zone, is_default boolean)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    SELECT p.relname::text, c.relname::text,
           CAST(substring(b.bound FROM 'FROM \(''([^'']*)''\)') AS timestamptz),
           CAST(substring(b.bound FROM 'TO \(''([^'']*)''\)') AS timestamptz),
           b.bound = 'DEFAULT'
    FROM pg_inherits AS i
    JOIN pg_class AS p ON p.oid = i.inhparent
    JOIN pg_class AS c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) AS b
    WHERE i.inhparent IN (CAST('delivered' AS regclass), CAST('attempts' AS regclass))
    ORDER BY 1, 3 NULLS FIRST
$$;

-- function key_generation_carry(integer)
CREATE FUNCTION outbox.key_generation_carry(batch integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_generation key_generation;
    v_read integer;
    v_last bigint;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_generation FROM key_generation FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR v_generation.carried_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    WITH chosen AS (
        SELECT m.id, m.target, m.idempotency_key
        FROM messages AS m
        WHERE m.id > v_generation.carry_after AND m.id <= v_generation.carry_until
        ORDER BY m.id
        LIMIT batch
    ), copied AS (
        INSERT INTO message_keys (target, idempotency_key, message_id, created_at, digest)
        SELECT k.target, k.idempotency_key, k.message_id, k.created_at, k.digest
        FROM chosen AS c
        JOIN message_keys_old AS k
          ON k.target = c.target AND k.idempotency_key = c.idempotency_key
         AND k.message_id = c.id
        ON CONFLICT (target, idempotency_key) DO NOTHING
    )
    SELECT count(*), max(id) INTO v_read, v_last FROM chosen;
    UPDATE key_generation
    SET carry_after = COALESCE(v_last, carry_until),
        carried_at = CASE WHEN v_read < batch THEN clock_timestamp() END;
    RETURN v_read;
END
$$;

-- function key_generation_turn(interval)
CREATE FUNCTION outbox.key_generation_turn(retention interval) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_generation key_generation;
    v_table text;
    -- named in full: the search path of these functions starts with pg_catalog
    v_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c
                      WHERE c.oid = CAST('key_generation' AS regclass));
BEGIN
    PERFORM _retention_floor(retention);
    SELECT * INTO v_generation FROM key_generation FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR v_generation.carried_at IS NULL
       OR v_generation.carried_at > now() - retention THEN
        RETURN NULL;
    END IF;
    LOCK TABLE message_keys, message_keys_old, events, events_old IN ACCESS EXCLUSIVE MODE;
    FOREACH v_table IN ARRAY ARRAY['message_keys', 'events'] LOOP
        EXECUTE format('DROP TABLE %s.%I', v_schema, v_table || '_old');
        EXECUTE format('ALTER INDEX %s.%I RENAME TO %I', v_schema, v_table || '_pkey',
                       v_table || '_old_pkey');
        EXECUTE format('ALTER TABLE %s.%I RENAME TO %I', v_schema, v_table, v_table || '_old');
        EXECUTE format('CREATE TABLE %s.%I (LIKE %s.%I INCLUDING ALL)', v_schema, v_table,
                       v_schema, v_table || '_old');
        PERFORM _grants_copy(CAST(format('%s.%I', v_schema, v_table || '_old') AS regclass),
                             CAST(format('%s.%I', v_schema, v_table) AS regclass));
    END LOOP;
    UPDATE key_generation
    SET generation = generation + 1, turned_at = now(),
        keys = CAST(format('%s.message_keys', v_schema) AS regclass),
        carry_after = 0,
        carry_until = (SELECT s.last_value FROM messages_id_seq AS s),
        carried_at = NULL
    RETURNING generation INTO v_generation.generation;
    RETURN v_generation.generation;
END
$$;

-- function key_lookup(text, text)
CREATE FUNCTION outbox.key_lookup(target text, idempotency_key text) RETURNS TABLE(message_id bigint, digest bytea)
    LANGUAGE plpgsql STABLE SECURITY DEFINER ROWS 1
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT k.message_id, k.digest FROM message_keys AS k
    WHERE k.target = key_lookup.target AND k.idempotency_key = key_lookup.idempotency_key
    UNION ALL
    SELECT k.message_id, k.digest FROM message_keys_old AS k
    WHERE k.target = key_lookup.target AND k.idempotency_key = key_lookup.idempotency_key
    LIMIT 1;
END
$$;

-- function key_taken_before(text, text)
CREATE FUNCTION outbox.key_taken_before(target text, idempotency_key text) RETURNS boolean
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    RETURN EXISTS (SELECT FROM message_keys_old AS k
                   WHERE k.target = key_taken_before.target
                     AND k.idempotency_key = key_taken_before.idempotency_key);
END
$$;

-- function message_insert_check()
CREATE FUNCTION outbox.message_insert_check() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF NOT pg_catalog.has_column_privilege(
            CAST(pg_catalog.format('%I.endpoints', TG_TABLE_SCHEMA) AS regclass),
            'url', 'UPDATE') THEN
        IF starts_with(NEW.event_type, 'outbox.') THEN
            RAISE EXCEPTION 'permission denied to write a message of type %', NEW.event_type
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Types under "outbox." are the outbox''s own alerts.';
        END IF;
        RAISE EXCEPTION 'permission denied to write a message for destination % without '
                        'its endpoint', NEW.destination
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

-- function publish(text, jsonb, text, text, integer, text, text, boolean, text)
CREATE FUNCTION outbox.publish(event_type text, payload jsonb, idempotency_key text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text, notify boolean DEFAULT true, tenant text DEFAULT NULL::text) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
#variable_conflict use_column
DECLARE
    v_key text;
    v_text text;
    v_body bytea;
    v_digest bytea;
    v_trace jsonb;
    v_fanned record;
    v_found record;
    v_tenant bigint := 0;
BEGIN
    -- the library's order of checks (outbox._core.Outbox._event)
    IF publish.event_type IS NULL THEN
        PERFORM _refuse('event_type', 'must not be null');
    ELSIF publish.event_type !~ '^[!-~]{1,255}$' THEN
        PERFORM _refuse('event_type', 'must be 1-255 printable characters without whitespace');
    ELSIF strpos(publish.event_type, '*') > 0 THEN
        PERFORM _refuse('event_type', 'must not contain ''*''');
    ELSIF starts_with(publish.event_type, 'outbox.') THEN
        PERFORM _refuse('event_type', 'must not start with ''outbox.'', the prefix of the '
                                      'outbox''s own events (alerts, test events)');
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
    v_body := _envelope(publish.event_type, v_text);
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
    v_digest := _event_digest(publish.event_type, v_text);

    IF publish.tenant IS NOT NULL THEN
        IF publish.tenant !~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$' THEN
            PERFORM _refuse('tenant', 'must be 1-128 letters, digits and ._:@- '
                                      'starting with a letter or digit');
        END IF;
        SELECT t.id INTO v_tenant FROM tenants AS t WHERE t.external_id = publish.tenant;
        IF NOT FOUND THEN
            -- a customer with no endpoints registered yet: nothing to send, and
            -- nothing is recorded (the event has no tenant to belong to)
            RETURN '{}';
        END IF;
    END IF;
    IF publish.ordering_key IS NOT NULL THEN
        PERFORM _lock_ordering_key(publish.ordering_key);
    END IF;
    v_fanned := _fan_out(publish.event_type, v_key, v_digest, v_body, v_tenant,
                         publish.ordering_key, COALESCE(publish.max_attempts, 8), v_trace,
                         NULL, true);
    IF v_fanned.filtered_endpoint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003', COLUMN = 'event_type', MESSAGE = format(
            'event_type: endpoint %s subscribes to %s with a payload filter, which only '
            'the Python library evaluates; publish this event from Python, or remove '
            'the endpoint''s filter', v_fanned.filtered_endpoint, _repr(publish.event_type));
    END IF;
    IF v_fanned.created_ids IS NOT NULL THEN
        IF publish.notify AND cardinality(v_fanned.created_ids) > 0 THEN
            PERFORM _wake();
        END IF;
        RETURN v_fanned.created_ids;
    END IF;
    -- the key was published before (or by a transaction that committed while
    -- this one waited): a new statement sees its event
    SELECT e.message_ids, e.digest INTO v_found
    FROM (SELECT * FROM events UNION ALL SELECT * FROM events_old) AS e
    WHERE e.tenant_id = v_tenant AND e.event_key = v_key
    LIMIT 1;
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
$_$;

-- ============================================================================
-- Tables and their sequences
-- ============================================================================

-- table alert_conditions
CREATE TABLE outbox.alert_conditions (
    condition text NOT NULL,
    active boolean NOT NULL,
    since timestamp with time zone NOT NULL
);

-- table api_cursor_key
CREATE TABLE outbox.api_cursor_key (
    one boolean DEFAULT true NOT NULL,
    key bytea NOT NULL,
    CONSTRAINT api_cursor_key_one_check CHECK (one)
);

-- table api_tokens
CREATE TABLE outbox.api_tokens (
    id bigint NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    scope text NOT NULL,
    tenant_id bigint,
    token_sha256 bytea NOT NULL,
    shown_prefix text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_used_at timestamp with time zone,
    revoked_at timestamp with time zone,
    CONSTRAINT api_tokens_name_check CHECK ((length(name) <= 200)),
    CONSTRAINT api_tokens_scope_check CHECK ((scope = ANY (ARRAY['read'::text, 'write'::text]))),
    CONSTRAINT api_tokens_shown_prefix_check CHECK ((shown_prefix ~ '^obx_[A-Za-z0-9_-]{4}$'::text)),
    CONSTRAINT api_tokens_token_sha256_check CHECK ((length(token_sha256) = 32))
);

-- sequence api_tokens_id_seq
ALTER TABLE outbox.api_tokens ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.api_tokens_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table attempts
CREATE TABLE outbox.attempts (
    message_id bigint NOT NULL,
    attempt outbox.attempt_number NOT NULL,
    owner text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    duration_ms integer,
    status integer,
    outcome text NOT NULL,
    error_class text,
    error text,
    response_excerpt text
)
PARTITION BY RANGE (started_at);

-- table attempts_default
CREATE TABLE outbox.attempts_default (
    message_id bigint CONSTRAINT attempts_message_id_not_null NOT NULL,
    attempt outbox.attempt_number CONSTRAINT attempts_attempt_not_null NOT NULL,
    owner text CONSTRAINT attempts_owner_not_null NOT NULL,
    started_at timestamp with time zone CONSTRAINT attempts_started_at_not_null NOT NULL,
    duration_ms integer,
    status integer,
    outcome text CONSTRAINT attempts_outcome_not_null NOT NULL,
    error_class text,
    error text,
    response_excerpt text
);

-- table audit_log
CREATE TABLE outbox.audit_log (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    token_id bigint NOT NULL,
    token_name text NOT NULL,
    tenant_id bigint,
    action text NOT NULL,
    resource text NOT NULL,
    resource_id text,
    before_sha256 text,
    after_sha256 text,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT audit_log_after_sha256_check CHECK ((after_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT audit_log_before_sha256_check CHECK ((before_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT audit_log_detail_check CHECK ((jsonb_typeof(detail) = 'object'::text))
);

-- sequence audit_log_id_seq
ALTER TABLE outbox.audit_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.audit_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table delivered
CREATE TABLE outbox.delivered (
    id bigint NOT NULL,
    idempotency_key text NOT NULL,
    target text NOT NULL,
    endpoint_id bigint,
    url text,
    method text NOT NULL,
    headers jsonb NOT NULL,
    body bytea NOT NULL,
    content_type text NOT NULL,
    event_type text,
    ordering_key text,
    attempts integer NOT NULL,
    max_attempts integer NOT NULL,
    last_status integer,
    created_at timestamp with time zone NOT NULL,
    completed_at timestamp with time zone NOT NULL,
    expunged_at timestamp with time zone
)
PARTITION BY RANGE (completed_at);

-- table delivered_default
CREATE TABLE outbox.delivered_default (
    id bigint CONSTRAINT delivered_id_not_null NOT NULL,
    idempotency_key text CONSTRAINT delivered_idempotency_key_not_null NOT NULL,
    target text CONSTRAINT delivered_target_not_null NOT NULL,
    endpoint_id bigint,
    url text,
    method text CONSTRAINT delivered_method_not_null NOT NULL,
    headers jsonb CONSTRAINT delivered_headers_not_null NOT NULL,
    body bytea CONSTRAINT delivered_body_not_null NOT NULL,
    content_type text CONSTRAINT delivered_content_type_not_null NOT NULL,
    event_type text,
    ordering_key text,
    attempts integer CONSTRAINT delivered_attempts_not_null NOT NULL,
    max_attempts integer CONSTRAINT delivered_max_attempts_not_null NOT NULL,
    last_status integer,
    created_at timestamp with time zone CONSTRAINT delivered_created_at_not_null NOT NULL,
    completed_at timestamp with time zone CONSTRAINT delivered_completed_at_not_null NOT NULL,
    expunged_at timestamp with time zone
);

-- table destination_health
CREATE TABLE outbox.destination_health (
    destination text NOT NULL,
    state text NOT NULL,
    blocked_until timestamp with time zone NOT NULL,
    failed_probes integer DEFAULT 0 NOT NULL,
    probe_owner text,
    opened_at timestamp with time zone,
    reason text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT destination_health_check CHECK (((state = 'probing'::text) = (probe_owner IS NOT NULL))),
    CONSTRAINT destination_health_check1 CHECK (((state = 'held'::text) = (opened_at IS NULL))),
    CONSTRAINT destination_health_failed_probes_check CHECK ((failed_probes >= 0)),
    CONSTRAINT destination_health_state_check CHECK ((state = ANY (ARRAY['held'::text, 'open'::text, 'probing'::text])))
);

-- table destination_policies
CREATE TABLE outbox.destination_policies (
    destination text NOT NULL,
    max_concurrency outbox.concurrency_cap,
    rate_limit_per_s outbox.rate_limit,
    rate_burst outbox.slot_number,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT destination_policies_check CHECK (((max_concurrency IS NOT NULL) OR (rate_limit_per_s IS NOT NULL))),
    CONSTRAINT destination_policies_check1 CHECK (((rate_limit_per_s IS NULL) = (rate_burst IS NULL)))
);

-- table destination_slots
CREATE TABLE outbox.destination_slots (
    destination text NOT NULL,
    slot outbox.slot_number NOT NULL,
    message_id bigint
);

-- table endpoint_secrets
CREATE TABLE outbox.endpoint_secrets (
    id bigint NOT NULL,
    endpoint_id bigint NOT NULL,
    secret text NOT NULL,
    expires_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    key_id text,
    CONSTRAINT endpoint_secrets_key_id_check CHECK ((key_id ~ '^[0-9a-f]{16}$'::text))
);

-- sequence endpoint_secrets_id_seq
ALTER TABLE outbox.endpoint_secrets ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.endpoint_secrets_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table endpoints
CREATE TABLE outbox.endpoints (
    id bigint NOT NULL,
    url text NOT NULL,
    description text DEFAULT ''::text NOT NULL,
    event_types text[] DEFAULT '{}'::text[] NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    disabled_reason text,
    disabled_at timestamp with time zone,
    failure_streak outbox.failure_count DEFAULT 0 NOT NULL,
    failing_since timestamp with time zone,
    last_success_at timestamp with time zone,
    max_concurrency outbox.concurrency_cap,
    rate_limit_per_s outbox.rate_limit,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    rate_burst outbox.slot_number,
    ca_bundle text,
    client_cert text,
    client_key text,
    client_key_id text,
    filter text,
    retry_schedule outbox.retry_schedule,
    auth text,
    auth_key_id text,
    auth_scheme text,
    auth_header_names text[] DEFAULT '{}'::text[] NOT NULL,
    basic_username text,
    oauth2_token_url text,
    oauth2_client_id text,
    oauth2_scope text,
    oauth2_audience text,
    tenant_id bigint,
    CONSTRAINT endpoints_auth_key_id_check CHECK ((auth_key_id ~ '^[0-9a-f]{16}$'::text)),
    CONSTRAINT endpoints_auth_key_id_with_auth CHECK (((auth_key_id IS NULL) OR (auth IS NOT NULL))),
    CONSTRAINT endpoints_auth_scheme_check CHECK ((auth_scheme = ANY (ARRAY['basic'::text, 'bearer'::text, 'oauth2'::text]))),
    CONSTRAINT endpoints_auth_with_credentials CHECK (((auth IS NULL) = ((auth_scheme IS NULL) AND (cardinality(auth_header_names) = 0)))),
    CONSTRAINT endpoints_basic_username_with_basic CHECK (((basic_username IS NOT NULL) = (NOT (auth_scheme IS DISTINCT FROM 'basic'::text)))),
    CONSTRAINT endpoints_client_cert_with_key CHECK (((client_cert IS NULL) = (client_key IS NULL))),
    CONSTRAINT endpoints_client_key_id_check CHECK ((client_key_id ~ '^[0-9a-f]{16}$'::text)),
    CONSTRAINT endpoints_client_key_id_with_key CHECK (((client_key_id IS NULL) OR (client_key IS NOT NULL))),
    CONSTRAINT endpoints_oauth2_client_with_oauth2 CHECK ((((oauth2_token_url IS NOT NULL) AND (oauth2_client_id IS NOT NULL)) = (NOT (auth_scheme IS DISTINCT FROM 'oauth2'::text)))),
    CONSTRAINT endpoints_oauth2_options_with_oauth2 CHECK ((((oauth2_scope IS NULL) AND (oauth2_audience IS NULL)) OR (NOT (auth_scheme IS DISTINCT FROM 'oauth2'::text))))
);

-- sequence endpoints_id_seq
ALTER TABLE outbox.endpoints ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.endpoints_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table event_types
CREATE TABLE outbox.event_types (
    event_type text NOT NULL,
    retry_schedule outbox.retry_schedule NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

-- table events
CREATE TABLE outbox.events (
    event_key text NOT NULL,
    event_type text NOT NULL,
    digest bytea NOT NULL,
    message_ids bigint[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    tenant_id bigint DEFAULT 0 NOT NULL,
    expunged_at timestamp with time zone
);

-- table events_old
CREATE TABLE outbox.events_old (
    event_key text CONSTRAINT events_event_key_not_null NOT NULL,
    event_type text CONSTRAINT events_event_type_not_null NOT NULL,
    digest bytea CONSTRAINT events_digest_not_null NOT NULL,
    message_ids bigint[] CONSTRAINT events_message_ids_not_null NOT NULL,
    created_at timestamp with time zone DEFAULT now() CONSTRAINT events_created_at_not_null NOT NULL,
    tenant_id bigint DEFAULT 0 CONSTRAINT events_tenant_id_not_null NOT NULL,
    expunged_at timestamp with time zone
);

-- table expunges
CREATE TABLE outbox.expunges (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    scope text NOT NULL,
    selector jsonb NOT NULL,
    messages integer NOT NULL,
    history integer NOT NULL,
    cancelled integer NOT NULL,
    running integer NOT NULL,
    CONSTRAINT expunges_cancelled_check CHECK ((cancelled >= 0)),
    CONSTRAINT expunges_history_check CHECK ((history >= 0)),
    CONSTRAINT expunges_messages_check CHECK ((messages >= 0)),
    CONSTRAINT expunges_running_check CHECK ((running >= 0)),
    CONSTRAINT expunges_scope_check CHECK ((scope = ANY (ARRAY['event'::text, 'endpoint'::text, 'key'::text, 'retention'::text]))),
    CONSTRAINT expunges_selector_check CHECK ((jsonb_typeof(selector) = 'object'::text))
);

-- sequence expunges_id_seq
ALTER TABLE outbox.expunges ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.expunges_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table key_generation
CREATE TABLE outbox.key_generation (
    one boolean DEFAULT true NOT NULL,
    generation integer NOT NULL,
    turned_at timestamp with time zone NOT NULL,
    keys oid NOT NULL,
    carry_after bigint DEFAULT 0 NOT NULL,
    carry_until bigint DEFAULT 0 NOT NULL,
    carried_at timestamp with time zone,
    CONSTRAINT key_generation_one_check CHECK (one)
);

-- table message_keys
CREATE TABLE outbox.message_keys (
    target text NOT NULL,
    idempotency_key text NOT NULL,
    message_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    digest bytea
);

-- table message_keys_old
CREATE TABLE outbox.message_keys_old (
    target text CONSTRAINT message_keys_target_not_null NOT NULL,
    idempotency_key text CONSTRAINT message_keys_idempotency_key_not_null NOT NULL,
    message_id bigint CONSTRAINT message_keys_message_id_not_null NOT NULL,
    created_at timestamp with time zone DEFAULT now() CONSTRAINT message_keys_created_at_not_null NOT NULL,
    digest bytea
);

-- table messages
CREATE TABLE outbox.messages (
    id bigint NOT NULL,
    idempotency_key text NOT NULL,
    target text NOT NULL,
    endpoint_id bigint,
    url text,
    method text DEFAULT 'POST'::text NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    body bytea NOT NULL,
    content_type text NOT NULL,
    event_type text,
    ordering_key text,
    state outbox.message_state DEFAULT 'ready'::text NOT NULL,
    attempts outbox.attempt_count DEFAULT 0 NOT NULL,
    max_attempts outbox.attempt_budget NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_until timestamp with time zone,
    last_error text,
    last_status integer,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    retry_base outbox.attempt_count DEFAULT 0 NOT NULL,
    destination text NOT NULL,
    trace_context jsonb,
    expunged_at timestamp with time zone,
    CONSTRAINT messages_check CHECK (((url IS NOT NULL) OR (endpoint_id IS NOT NULL))),
    CONSTRAINT messages_check1 CHECK ((((state)::text = 'running'::text) = ((lease_owner IS NOT NULL) AND (lease_until IS NOT NULL)))),
    CONSTRAINT messages_endpoint_alone CHECK (((endpoint_id IS NULL) OR ((url IS NULL) AND (destination = ('endpoint:'::text || endpoint_id)))))
);

-- sequence messages_id_seq
ALTER TABLE outbox.messages ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME outbox.messages_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table portal_links
CREATE TABLE outbox.portal_links (
    id bigint NOT NULL,
    token_hash bytea NOT NULL,
    tenant_id bigint NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT portal_links_check CHECK ((expires_at > created_at)),
    CONSTRAINT portal_links_token_hash_check CHECK ((length(token_hash) = 32))
);

-- sequence portal_links_id_seq
ALTER TABLE outbox.portal_links ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.portal_links_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table rate_slots
CREATE TABLE outbox.rate_slots (
    destination text NOT NULL,
    slot outbox.slot_number NOT NULL,
    period interval NOT NULL,
    next_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL
);

-- table retention_rules
CREATE TABLE outbox.retention_rules (
    id bigint NOT NULL,
    endpoint_id bigint,
    event_type text,
    payload_retention_s double precision NOT NULL,
    erased_until timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT retention_rules_check CHECK ((num_nonnulls(endpoint_id, event_type) = 1)),
    CONSTRAINT retention_rules_payload_retention_s_check CHECK (((payload_retention_s >= (60)::double precision) AND (payload_retention_s <= ('3153600000'::bigint)::double precision)))
);

-- sequence retention_rules_id_seq
ALTER TABLE outbox.retention_rules ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.retention_rules_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table schema_migrations
CREATE TABLE outbox.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

-- table tenants
CREATE TABLE outbox.tenants (
    id bigint NOT NULL,
    external_id text NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    rate_limit_per_s outbox.rate_limit,
    rate_burst outbox.slot_number,
    retry_schedule outbox.retry_schedule,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tenants_check CHECK (((rate_limit_per_s IS NULL) = (rate_burst IS NULL))),
    CONSTRAINT tenants_external_id_check CHECK ((external_id ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'::text)),
    CONSTRAINT tenants_metadata_check CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT tenants_name_check CHECK ((length(name) <= 200))
);

-- sequence tenants_id_seq
ALTER TABLE outbox.tenants ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.tenants_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table unseated_requests
CREATE TABLE outbox.unseated_requests (
    message_id bigint NOT NULL,
    destination text NOT NULL
);

-- ============================================================================
-- Partitions (the DEFAULT ones; the daily ones are the dispatchers')
-- ============================================================================

-- table attach attempts_default
ALTER TABLE ONLY outbox.attempts ATTACH PARTITION outbox.attempts_default DEFAULT;

-- table attach delivered_default
ALTER TABLE ONLY outbox.delivered ATTACH PARTITION outbox.delivered_default DEFAULT;

-- ============================================================================
-- Constraints
-- ============================================================================

-- constraint alert_conditions_pkey on alert_conditions
ALTER TABLE ONLY outbox.alert_conditions
    ADD CONSTRAINT alert_conditions_pkey PRIMARY KEY (condition);

-- constraint api_cursor_key_pkey on api_cursor_key
ALTER TABLE ONLY outbox.api_cursor_key
    ADD CONSTRAINT api_cursor_key_pkey PRIMARY KEY (one);

-- constraint api_tokens_pkey on api_tokens
ALTER TABLE ONLY outbox.api_tokens
    ADD CONSTRAINT api_tokens_pkey PRIMARY KEY (id);

-- constraint api_tokens_token_sha256_key on api_tokens
ALTER TABLE ONLY outbox.api_tokens
    ADD CONSTRAINT api_tokens_token_sha256_key UNIQUE (token_sha256);

-- constraint attempts_default_pkey on attempts_default
ALTER TABLE ONLY outbox.attempts_default
    ADD CONSTRAINT attempts_default_pkey PRIMARY KEY (message_id, attempt);

-- constraint audit_log_pkey on audit_log
ALTER TABLE ONLY outbox.audit_log
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);

-- constraint delivered_default_pkey on delivered_default
ALTER TABLE ONLY outbox.delivered_default
    ADD CONSTRAINT delivered_default_pkey PRIMARY KEY (id);

-- constraint destination_health_pkey on destination_health
ALTER TABLE ONLY outbox.destination_health
    ADD CONSTRAINT destination_health_pkey PRIMARY KEY (destination);

-- constraint destination_policies_pkey on destination_policies
ALTER TABLE ONLY outbox.destination_policies
    ADD CONSTRAINT destination_policies_pkey PRIMARY KEY (destination);

-- constraint destination_slots_pkey on destination_slots
ALTER TABLE ONLY outbox.destination_slots
    ADD CONSTRAINT destination_slots_pkey PRIMARY KEY (destination, slot);

-- constraint endpoint_secrets_pkey on endpoint_secrets
ALTER TABLE ONLY outbox.endpoint_secrets
    ADD CONSTRAINT endpoint_secrets_pkey PRIMARY KEY (id);

-- constraint endpoints_pkey on endpoints
ALTER TABLE ONLY outbox.endpoints
    ADD CONSTRAINT endpoints_pkey PRIMARY KEY (id);

-- constraint event_types_pkey on event_types
ALTER TABLE ONLY outbox.event_types
    ADD CONSTRAINT event_types_pkey PRIMARY KEY (event_type);

-- constraint events_old_pkey on events_old
ALTER TABLE ONLY outbox.events_old
    ADD CONSTRAINT events_old_pkey PRIMARY KEY (tenant_id, event_key);

-- constraint events_pkey on events
ALTER TABLE ONLY outbox.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (tenant_id, event_key);

-- constraint expunges_pkey on expunges
ALTER TABLE ONLY outbox.expunges
    ADD CONSTRAINT expunges_pkey PRIMARY KEY (id);

-- constraint key_generation_pkey on key_generation
ALTER TABLE ONLY outbox.key_generation
    ADD CONSTRAINT key_generation_pkey PRIMARY KEY (one);

-- constraint message_keys_old_pkey on message_keys_old
ALTER TABLE ONLY outbox.message_keys_old
    ADD CONSTRAINT message_keys_old_pkey PRIMARY KEY (target, idempotency_key);

-- constraint message_keys_pkey on message_keys
ALTER TABLE ONLY outbox.message_keys
    ADD CONSTRAINT message_keys_pkey PRIMARY KEY (target, idempotency_key);

-- constraint messages_pkey on messages
ALTER TABLE ONLY outbox.messages
    ADD CONSTRAINT messages_pkey PRIMARY KEY (id);

-- constraint portal_links_pkey on portal_links
ALTER TABLE ONLY outbox.portal_links
    ADD CONSTRAINT portal_links_pkey PRIMARY KEY (id);

-- constraint portal_links_token_hash_key on portal_links
ALTER TABLE ONLY outbox.portal_links
    ADD CONSTRAINT portal_links_token_hash_key UNIQUE (token_hash);

-- constraint rate_slots_pkey on rate_slots
ALTER TABLE ONLY outbox.rate_slots
    ADD CONSTRAINT rate_slots_pkey PRIMARY KEY (destination, slot);

-- constraint retention_rules_endpoint_id_key on retention_rules
ALTER TABLE ONLY outbox.retention_rules
    ADD CONSTRAINT retention_rules_endpoint_id_key UNIQUE (endpoint_id);

-- constraint retention_rules_event_type_key on retention_rules
ALTER TABLE ONLY outbox.retention_rules
    ADD CONSTRAINT retention_rules_event_type_key UNIQUE (event_type);

-- constraint retention_rules_pkey on retention_rules
ALTER TABLE ONLY outbox.retention_rules
    ADD CONSTRAINT retention_rules_pkey PRIMARY KEY (id);

-- constraint schema_migrations_pkey on schema_migrations
ALTER TABLE ONLY outbox.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

-- constraint tenants_external_id_key on tenants
ALTER TABLE ONLY outbox.tenants
    ADD CONSTRAINT tenants_external_id_key UNIQUE (external_id);

-- constraint tenants_pkey on tenants
ALTER TABLE ONLY outbox.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (id);

-- constraint unseated_requests_pkey on unseated_requests
ALTER TABLE ONLY outbox.unseated_requests
    ADD CONSTRAINT unseated_requests_pkey PRIMARY KEY (message_id);

-- ============================================================================
-- Indexes
-- ============================================================================

-- index attempts_started_idx
CREATE INDEX attempts_started_idx ON ONLY outbox.attempts USING btree (started_at);

-- index attempts_default_started_at_idx
CREATE INDEX attempts_default_started_at_idx ON outbox.attempts_default USING btree (started_at);

-- index delivered_completed_idx
CREATE INDEX delivered_completed_idx ON ONLY outbox.delivered USING btree (completed_at);

-- index delivered_created_idx
CREATE INDEX delivered_created_idx ON ONLY outbox.delivered USING btree (created_at);

-- index delivered_default_completed_at_idx
CREATE INDEX delivered_default_completed_at_idx ON outbox.delivered_default USING btree (completed_at);

-- index delivered_default_created_at_idx
CREATE INDEX delivered_default_created_at_idx ON outbox.delivered_default USING btree (created_at);

-- index delivered_endpoint_idx
CREATE INDEX delivered_endpoint_idx ON ONLY outbox.delivered USING btree (endpoint_id, completed_at) WHERE (endpoint_id IS NOT NULL);

-- index delivered_default_endpoint_id_completed_at_idx
CREATE INDEX delivered_default_endpoint_id_completed_at_idx ON outbox.delivered_default USING btree (endpoint_id, completed_at) WHERE (endpoint_id IS NOT NULL);

-- index delivered_key_idx
CREATE INDEX delivered_key_idx ON ONLY outbox.delivered USING btree (idempotency_key);

-- index delivered_default_idempotency_key_idx
CREATE INDEX delivered_default_idempotency_key_idx ON outbox.delivered_default USING btree (idempotency_key);

-- index destination_slots_free_idx
CREATE INDEX destination_slots_free_idx ON outbox.destination_slots USING btree (destination, slot) WHERE (message_id IS NULL);

-- index destination_slots_holder_idx
CREATE UNIQUE INDEX destination_slots_holder_idx ON outbox.destination_slots USING btree (message_id) WHERE (message_id IS NOT NULL);

-- index endpoint_secrets_endpoint_idx
CREATE INDEX endpoint_secrets_endpoint_idx ON outbox.endpoint_secrets USING btree (endpoint_id, id);

-- index endpoints_alerts_idx
CREATE INDEX endpoints_alerts_idx ON outbox.endpoints USING btree (id) WHERE ((tenant_id IS NULL) AND enabled AND outbox._takes_alerts(event_types));

-- index endpoints_fanout_idx
CREATE INDEX endpoints_fanout_idx ON outbox.endpoints USING btree (COALESCE(tenant_id, (0)::bigint), id);

-- index endpoints_policed_idx
CREATE INDEX endpoints_policed_idx ON outbox.endpoints USING btree (id) WHERE ((max_concurrency IS NOT NULL) OR (rate_limit_per_s IS NOT NULL));

-- index endpoints_tenant_idx
CREATE INDEX endpoints_tenant_idx ON outbox.endpoints USING btree (tenant_id, id) WHERE (tenant_id IS NOT NULL);

-- index messages_claimable_idx
CREATE INDEX messages_claimable_idx ON outbox.messages USING btree (destination, available_at, id) WHERE ((state)::text = 'ready'::text);

-- index messages_dead_idx
CREATE INDEX messages_dead_idx ON outbox.messages USING btree (completed_at, id) WHERE ((state)::text = 'dead'::text);

-- index messages_endpoint_idx
CREATE INDEX messages_endpoint_idx ON outbox.messages USING btree (endpoint_id) WHERE (endpoint_id IS NOT NULL);

-- index messages_lease_idx
CREATE INDEX messages_lease_idx ON outbox.messages USING btree (lease_until) WHERE ((state)::text = 'running'::text);

-- index messages_ordering_idx
CREATE INDEX messages_ordering_idx ON outbox.messages USING btree (ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND ((state)::text = ANY (ARRAY['ready'::text, 'running'::text, 'paused'::text])));

-- index portal_links_tenant_idx
CREATE INDEX portal_links_tenant_idx ON outbox.portal_links USING btree (tenant_id, expires_at);

-- index unseated_requests_destination_idx
CREATE INDEX unseated_requests_destination_idx ON outbox.unseated_requests USING btree (destination, message_id);

-- index attach attempts_default_started_at_idx
ALTER INDEX outbox.attempts_started_idx ATTACH PARTITION outbox.attempts_default_started_at_idx;

-- index attach delivered_default_completed_at_idx
ALTER INDEX outbox.delivered_completed_idx ATTACH PARTITION outbox.delivered_default_completed_at_idx;

-- index attach delivered_default_created_at_idx
ALTER INDEX outbox.delivered_created_idx ATTACH PARTITION outbox.delivered_default_created_at_idx;

-- index attach delivered_default_endpoint_id_completed_at_idx
ALTER INDEX outbox.delivered_endpoint_idx ATTACH PARTITION outbox.delivered_default_endpoint_id_completed_at_idx;

-- index attach delivered_default_idempotency_key_idx
ALTER INDEX outbox.delivered_key_idx ATTACH PARTITION outbox.delivered_default_idempotency_key_idx;

-- ============================================================================
-- Triggers
-- ============================================================================

-- trigger destination_health_alert_closed on destination_health
CREATE TRIGGER destination_health_alert_closed AFTER DELETE ON outbox.destination_health FOR EACH ROW WHEN ((old.state <> 'held'::text)) EXECUTE FUNCTION outbox.alert_breaker();

-- trigger destination_health_alert_hold_opened on destination_health
CREATE TRIGGER destination_health_alert_hold_opened AFTER UPDATE OF state ON outbox.destination_health FOR EACH ROW WHEN (((old.state = 'held'::text) AND (new.state = 'open'::text))) EXECUTE FUNCTION outbox.alert_breaker();

-- trigger destination_health_alert_opened on destination_health
CREATE TRIGGER destination_health_alert_opened AFTER INSERT ON outbox.destination_health FOR EACH ROW WHEN ((new.state = 'open'::text)) EXECUTE FUNCTION outbox.alert_breaker();

-- trigger endpoints_alert_disabled on endpoints
CREATE TRIGGER endpoints_alert_disabled AFTER UPDATE OF enabled ON outbox.endpoints FOR EACH ROW WHEN ((old.enabled AND (NOT new.enabled))) EXECUTE FUNCTION outbox.alert_endpoint_disabled();

-- trigger endpoints_enable_check on endpoints
CREATE TRIGGER endpoints_enable_check BEFORE UPDATE OF enabled ON outbox.endpoints FOR EACH ROW WHEN ((new.enabled AND (NOT old.enabled))) EXECUTE FUNCTION outbox.endpoint_enable_check();

-- trigger messages_alert_dead on messages
CREATE TRIGGER messages_alert_dead AFTER UPDATE OF state ON outbox.messages FOR EACH ROW WHEN ((((new.state)::text = 'dead'::text) AND ((old.state)::text <> 'dead'::text) AND ((new.event_type IS NULL) OR (NOT starts_with(new.event_type, 'outbox.'::text))))) EXECUTE FUNCTION outbox.alert_message_dead();

-- trigger messages_insert_check on messages
CREATE TRIGGER messages_insert_check BEFORE INSERT ON outbox.messages FOR EACH ROW WHEN ((starts_with(new.event_type, 'outbox.'::text) OR ((new.endpoint_id IS NULL) AND starts_with(new.destination, 'endpoint:'::text)))) EXECUTE FUNCTION outbox.message_insert_check();

-- ============================================================================
-- Foreign keys
-- ============================================================================

-- fk constraint api_tokens_tenant_id_fkey on api_tokens
ALTER TABLE ONLY outbox.api_tokens
    ADD CONSTRAINT api_tokens_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES outbox.tenants(id) ON DELETE CASCADE;

-- fk constraint endpoint_secrets_endpoint_id_fkey on endpoint_secrets
ALTER TABLE ONLY outbox.endpoint_secrets
    ADD CONSTRAINT endpoint_secrets_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES outbox.endpoints(id) ON DELETE CASCADE;

-- fk constraint endpoints_tenant_id_fkey on endpoints
ALTER TABLE ONLY outbox.endpoints
    ADD CONSTRAINT endpoints_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES outbox.tenants(id);

-- fk constraint messages_endpoint_id_fkey on messages
ALTER TABLE ONLY outbox.messages
    ADD CONSTRAINT messages_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES outbox.endpoints(id) ON DELETE SET NULL;

-- fk constraint portal_links_tenant_id_fkey on portal_links
ALTER TABLE ONLY outbox.portal_links
    ADD CONSTRAINT portal_links_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES outbox.tenants(id) ON DELETE CASCADE;

-- fk constraint retention_rules_endpoint_id_fkey on retention_rules
ALTER TABLE ONLY outbox.retention_rules
    ADD CONSTRAINT retention_rules_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES outbox.endpoints(id) ON DELETE CASCADE;

-- ============================================================================
-- Grants: `outbox roles`, and what the migrations revoke from PUBLIC
-- ============================================================================

-- on schema outbox
GRANT USAGE ON SCHEMA outbox TO outbox_producer;
GRANT USAGE ON SCHEMA outbox TO outbox_dispatcher;
GRANT USAGE ON SCHEMA outbox TO outbox_operator;

-- on function _alert(event_type text, event_key text, data jsonb, passed_over bigint)
REVOKE ALL ON FUNCTION outbox._alert(event_type text, event_key text, data jsonb, passed_over bigint) FROM PUBLIC;

-- on function _alert_endpoint(destination text)
REVOKE ALL ON FUNCTION outbox._alert_endpoint(destination text) FROM PUBLIC;

-- on function _alert_key_part(value text)
REVOKE ALL ON FUNCTION outbox._alert_key_part(value text) FROM PUBLIC;

-- on function _alert_tenant(endpoint_id bigint)
REVOKE ALL ON FUNCTION outbox._alert_tenant(endpoint_id bigint) FROM PUBLIC;

-- on function _alert_time(at timestamp with time zone)
REVOKE ALL ON FUNCTION outbox._alert_time(at timestamp with time zone) FROM PUBLIC;

-- on function _alerts_wanted()
REVOKE ALL ON FUNCTION outbox._alerts_wanted() FROM PUBLIC;

-- on function _check_headers(headers jsonb)
REVOKE ALL ON FUNCTION outbox._check_headers(headers jsonb) FROM PUBLIC;

-- on function _check_key(value text, field text)
REVOKE ALL ON FUNCTION outbox._check_key(value text, field text) FROM PUBLIC;

-- on function _compact(value jsonb)
REVOKE ALL ON FUNCTION outbox._compact(value jsonb) FROM PUBLIC;

-- on function _digest_field(data bytea)
REVOKE ALL ON FUNCTION outbox._digest_field(data bytea) FROM PUBLIC;

-- on function _envelope(event_type text, data text)
REVOKE ALL ON FUNCTION outbox._envelope(event_type text, data text) FROM PUBLIC;

-- on function _event_digest(event_type text, data text)
REVOKE ALL ON FUNCTION outbox._event_digest(event_type text, data text) FROM PUBLIC;

-- on function _fan_out(event_type text, event_key text, digest bytea, body bytea, tenant_id bigint, ordering_key text, max_attempts integer, trace_context jsonb, passed_over bigint, record_empty boolean, OUT created_ids bigint[], OUT filtered_endpoint bigint)
REVOKE ALL ON FUNCTION outbox._fan_out(event_type text, event_key text, digest bytea, body bytea, tenant_id bigint, ordering_key text, max_attempts integer, trace_context jsonb, passed_over bigint, record_empty boolean, OUT created_ids bigint[], OUT filtered_endpoint bigint) FROM PUBLIC;

-- on function _grants_copy(source regclass, target regclass)
REVOKE ALL ON FUNCTION outbox._grants_copy(source regclass, target regclass) FROM PUBLIC;

-- on function _history_partition_add(parent text, lower timestamp with time zone, upper timestamp with time zone)
REVOKE ALL ON FUNCTION outbox._history_partition_add(parent text, lower timestamp with time zone, upper timestamp with time zone) FROM PUBLIC;

-- on function _inet_aton(host text)
REVOKE ALL ON FUNCTION outbox._inet_aton(host text) FROM PUBLIC;

-- on function _ip_version(address text)
REVOKE ALL ON FUNCTION outbox._ip_version(address text) FROM PUBLIC;

-- on function _ipv4_problem(host text)
REVOKE ALL ON FUNCTION outbox._ipv4_problem(host text) FROM PUBLIC;

-- on function _lock_ordering_key(ordering_key text)
REVOKE ALL ON FUNCTION outbox._lock_ordering_key(ordering_key text) FROM PUBLIC;

-- on function _producer_constants(OUT wake_class integer, OUT wake_object integer, OUT channel text, OUT ordering_seed integer)
REVOKE ALL ON FUNCTION outbox._producer_constants(OUT wake_class integer, OUT wake_object integer, OUT channel text, OUT ordering_seed integer) FROM PUBLIC;

-- on function _refuse(field text, problem text)
REVOKE ALL ON FUNCTION outbox._refuse(field text, problem text) FROM PUBLIC;

-- on function _repr(value text)
REVOKE ALL ON FUNCTION outbox._repr(value text) FROM PUBLIC;

-- on function _retention_floor(retention interval)
REVOKE ALL ON FUNCTION outbox._retention_floor(retention interval) FROM PUBLIC;

-- on function _trace_context(traceparent text, tracestate text)
REVOKE ALL ON FUNCTION outbox._trace_context(traceparent text, tracestate text) FROM PUBLIC;

-- on function _url_origin(url text)
REVOKE ALL ON FUNCTION outbox._url_origin(url text) FROM PUBLIC;

-- on function _wake()
REVOKE ALL ON FUNCTION outbox._wake() FROM PUBLIC;

-- on function alert_breaker()
REVOKE ALL ON FUNCTION outbox.alert_breaker() FROM PUBLIC;

-- on function alert_endpoint_disabled()
REVOKE ALL ON FUNCTION outbox.alert_endpoint_disabled() FROM PUBLIC;

-- on function alert_lag(oldest_s double precision, threshold_s double precision, destination text)
REVOKE ALL ON FUNCTION outbox.alert_lag(oldest_s double precision, threshold_s double precision, destination text) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.alert_lag(oldest_s double precision, threshold_s double precision, destination text) TO outbox_dispatcher;

-- on function alert_message_dead()
REVOKE ALL ON FUNCTION outbox.alert_message_dead() FROM PUBLIC;

-- on function alert_unknown_key(key_id text, endpoint_id bigint, dispatcher text)
REVOKE ALL ON FUNCTION outbox.alert_unknown_key(key_id text, endpoint_id bigint, dispatcher text) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.alert_unknown_key(key_id text, endpoint_id bigint, dispatcher text) TO outbox_dispatcher;

-- on function enqueue(url text, idempotency_key text, json_body jsonb, body bytea, content_type text, method text, headers jsonb, ordering_key text, available_at timestamp with time zone, max_attempts integer, traceparent text, tracestate text, notify boolean)
REVOKE ALL ON FUNCTION outbox.enqueue(url text, idempotency_key text, json_body jsonb, body bytea, content_type text, method text, headers jsonb, ordering_key text, available_at timestamp with time zone, max_attempts integer, traceparent text, tracestate text, notify boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.enqueue(url text, idempotency_key text, json_body jsonb, body bytea, content_type text, method text, headers jsonb, ordering_key text, available_at timestamp with time zone, max_attempts integer, traceparent text, tracestate text, notify boolean) TO outbox_producer;

-- on function expire_payloads(batch integer)
REVOKE ALL ON FUNCTION outbox.expire_payloads(batch integer) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.expire_payloads(batch integer) TO outbox_dispatcher;

-- on function history_drop(partition text, retention interval)
REVOKE ALL ON FUNCTION outbox.history_drop(partition text, retention interval) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.history_drop(partition text, retention interval) TO outbox_dispatcher;

-- on function history_extend(ahead interval, step text, most integer)
REVOKE ALL ON FUNCTION outbox.history_extend(ahead interval, step text, most integer) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.history_extend(ahead interval, step text, most integer) TO outbox_dispatcher;

-- on function history_partitions()
REVOKE ALL ON FUNCTION outbox.history_partitions() FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.history_partitions() TO outbox_dispatcher;

-- on function key_generation_carry(batch integer)
REVOKE ALL ON FUNCTION outbox.key_generation_carry(batch integer) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.key_generation_carry(batch integer) TO outbox_dispatcher;

-- on function key_generation_turn(retention interval)
REVOKE ALL ON FUNCTION outbox.key_generation_turn(retention interval) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.key_generation_turn(retention interval) TO outbox_dispatcher;

-- on function key_lookup(target text, idempotency_key text)
REVOKE ALL ON FUNCTION outbox.key_lookup(target text, idempotency_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.key_lookup(target text, idempotency_key text) TO outbox_producer;

-- on function key_taken_before(target text, idempotency_key text)
REVOKE ALL ON FUNCTION outbox.key_taken_before(target text, idempotency_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.key_taken_before(target text, idempotency_key text) TO outbox_producer;

-- on function publish(event_type text, payload jsonb, idempotency_key text, ordering_key text, max_attempts integer, traceparent text, tracestate text, notify boolean, tenant text)
REVOKE ALL ON FUNCTION outbox.publish(event_type text, payload jsonb, idempotency_key text, ordering_key text, max_attempts integer, traceparent text, tracestate text, notify boolean, tenant text) FROM PUBLIC;
GRANT ALL ON FUNCTION outbox.publish(event_type text, payload jsonb, idempotency_key text, ordering_key text, max_attempts integer, traceparent text, tracestate text, notify boolean, tenant text) TO outbox_producer;

-- on table alert_conditions
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.alert_conditions TO outbox_operator;

-- on table api_cursor_key
GRANT SELECT ON TABLE outbox.api_cursor_key TO outbox_operator;

-- on table api_tokens
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.api_tokens TO outbox_operator;

-- on table attempts
GRANT DELETE ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.attempts TO outbox_operator;
GRANT SELECT(message_id),INSERT(message_id) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT SELECT(attempt),INSERT(attempt) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT SELECT(owner),INSERT(owner) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT SELECT(started_at),INSERT(started_at) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT INSERT(duration_ms) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT INSERT(status) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT SELECT(outcome),INSERT(outcome) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT INSERT(error_class) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT INSERT(error) ON TABLE outbox.attempts TO outbox_dispatcher;
GRANT INSERT(response_excerpt) ON TABLE outbox.attempts TO outbox_dispatcher;

-- on table audit_log
GRANT SELECT,INSERT ON TABLE outbox.audit_log TO outbox_operator;

-- on table delivered
GRANT DELETE ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.delivered TO outbox_operator;
GRANT SELECT(id),INSERT(id) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT SELECT(idempotency_key),INSERT(idempotency_key) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT SELECT(target),INSERT(target) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(endpoint_id) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(url) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(method) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(headers) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(body) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(content_type) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(event_type) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(ordering_key) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(attempts) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(max_attempts) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(last_status) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT INSERT(created_at) ON TABLE outbox.delivered TO outbox_dispatcher;
GRANT SELECT(completed_at),INSERT(completed_at),UPDATE(completed_at) ON TABLE outbox.delivered TO outbox_dispatcher;

-- on table destination_health
GRANT DELETE ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.destination_health TO outbox_operator;
GRANT SELECT(destination),INSERT(destination) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT SELECT(state),INSERT(state),UPDATE(state) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT SELECT(blocked_until),INSERT(blocked_until),UPDATE(blocked_until) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT SELECT(failed_probes),UPDATE(failed_probes) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT SELECT(probe_owner),UPDATE(probe_owner) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT INSERT(opened_at),UPDATE(opened_at) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT SELECT(reason),INSERT(reason),UPDATE(reason) ON TABLE outbox.destination_health TO outbox_dispatcher;
GRANT UPDATE(updated_at) ON TABLE outbox.destination_health TO outbox_dispatcher;

-- on table destination_policies
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.destination_policies TO outbox_operator;
GRANT SELECT(destination) ON TABLE outbox.destination_policies TO outbox_dispatcher;

-- on table destination_slots
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.destination_slots TO outbox_operator;
GRANT SELECT(destination) ON TABLE outbox.destination_slots TO outbox_dispatcher;
GRANT SELECT(slot) ON TABLE outbox.destination_slots TO outbox_dispatcher;
GRANT SELECT(message_id),UPDATE(message_id) ON TABLE outbox.destination_slots TO outbox_dispatcher;

-- on table endpoint_secrets
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.endpoint_secrets TO outbox_operator;
GRANT SELECT(id) ON TABLE outbox.endpoint_secrets TO outbox_dispatcher;
GRANT SELECT(endpoint_id) ON TABLE outbox.endpoint_secrets TO outbox_dispatcher;
GRANT SELECT(secret) ON TABLE outbox.endpoint_secrets TO outbox_dispatcher;
GRANT SELECT(expires_at) ON TABLE outbox.endpoint_secrets TO outbox_dispatcher;
GRANT SELECT(key_id) ON TABLE outbox.endpoint_secrets TO outbox_dispatcher;

-- on table endpoints
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.endpoints TO outbox_operator;
GRANT SELECT(id) ON TABLE outbox.endpoints TO outbox_producer;
GRANT SELECT(id) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(url) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(event_types) ON TABLE outbox.endpoints TO outbox_producer;
GRANT SELECT(enabled) ON TABLE outbox.endpoints TO outbox_producer;
GRANT SELECT(enabled),UPDATE(enabled) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(disabled_reason),UPDATE(disabled_reason) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(disabled_at),UPDATE(disabled_at) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(failure_streak),UPDATE(failure_streak) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(failing_since),UPDATE(failing_since) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(last_success_at),UPDATE(last_success_at) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(max_concurrency) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(rate_limit_per_s) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT UPDATE(updated_at) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(ca_bundle) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(client_cert) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(client_key) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(client_key_id) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(filter) ON TABLE outbox.endpoints TO outbox_producer;
GRANT SELECT(retry_schedule) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(auth) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(auth_key_id) ON TABLE outbox.endpoints TO outbox_dispatcher;
GRANT SELECT(tenant_id) ON TABLE outbox.endpoints TO outbox_producer;

-- on table event_types
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.event_types TO outbox_operator;
GRANT SELECT(event_type) ON TABLE outbox.event_types TO outbox_dispatcher;
GRANT SELECT(retry_schedule) ON TABLE outbox.event_types TO outbox_dispatcher;

-- on table events
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.events TO outbox_operator;
GRANT SELECT(event_key),INSERT(event_key) ON TABLE outbox.events TO outbox_producer;
GRANT INSERT(event_type) ON TABLE outbox.events TO outbox_producer;
GRANT SELECT(digest),INSERT(digest) ON TABLE outbox.events TO outbox_producer;
GRANT SELECT(message_ids),INSERT(message_ids) ON TABLE outbox.events TO outbox_producer;
GRANT SELECT(tenant_id),INSERT(tenant_id) ON TABLE outbox.events TO outbox_producer;

-- on table events_old
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.events_old TO outbox_operator;
GRANT SELECT(event_key),INSERT(event_key) ON TABLE outbox.events_old TO outbox_producer;
GRANT INSERT(event_type) ON TABLE outbox.events_old TO outbox_producer;
GRANT SELECT(digest),INSERT(digest) ON TABLE outbox.events_old TO outbox_producer;
GRANT SELECT(message_ids),INSERT(message_ids) ON TABLE outbox.events_old TO outbox_producer;
GRANT SELECT(tenant_id),INSERT(tenant_id) ON TABLE outbox.events_old TO outbox_producer;

-- on table expunges
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.expunges TO outbox_operator;

-- on table key_generation
GRANT SELECT ON TABLE outbox.key_generation TO outbox_operator;
GRANT SELECT(keys) ON TABLE outbox.key_generation TO outbox_producer;

-- on table message_keys
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.message_keys TO outbox_operator;
GRANT INSERT(target) ON TABLE outbox.message_keys TO outbox_producer;
GRANT INSERT(idempotency_key) ON TABLE outbox.message_keys TO outbox_producer;
GRANT SELECT(message_id),INSERT(message_id) ON TABLE outbox.message_keys TO outbox_producer;
GRANT INSERT(digest) ON TABLE outbox.message_keys TO outbox_producer;

-- on table message_keys_old
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.message_keys_old TO outbox_operator;
GRANT INSERT(target) ON TABLE outbox.message_keys_old TO outbox_producer;
GRANT INSERT(idempotency_key) ON TABLE outbox.message_keys_old TO outbox_producer;
GRANT SELECT(message_id),INSERT(message_id) ON TABLE outbox.message_keys_old TO outbox_producer;
GRANT INSERT(digest) ON TABLE outbox.message_keys_old TO outbox_producer;

-- on table messages
GRANT SELECT,DELETE ON TABLE outbox.messages TO outbox_dispatcher;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.messages TO outbox_operator;
GRANT SELECT(id),INSERT(id) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(idempotency_key) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(target) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(endpoint_id) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(url) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(method) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(headers) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(body) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(content_type) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(event_type) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(ordering_key) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(state) ON TABLE outbox.messages TO outbox_producer;
GRANT UPDATE(state) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT UPDATE(attempts) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT INSERT(max_attempts) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(available_at) ON TABLE outbox.messages TO outbox_producer;
GRANT UPDATE(available_at) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT UPDATE(lease_owner) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT UPDATE(lease_until) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT UPDATE(last_error) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT UPDATE(last_status) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT UPDATE(completed_at) ON TABLE outbox.messages TO outbox_dispatcher;
GRANT INSERT(destination) ON TABLE outbox.messages TO outbox_producer;
GRANT INSERT(trace_context) ON TABLE outbox.messages TO outbox_producer;

-- on sequence messages_id_seq
GRANT USAGE ON SEQUENCE outbox.messages_id_seq TO outbox_producer;
GRANT USAGE ON SEQUENCE outbox.messages_id_seq TO outbox_operator;

-- on table portal_links
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.portal_links TO outbox_operator;

-- on table rate_slots
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.rate_slots TO outbox_operator;
GRANT SELECT(destination) ON TABLE outbox.rate_slots TO outbox_dispatcher;
GRANT SELECT(slot) ON TABLE outbox.rate_slots TO outbox_dispatcher;
GRANT SELECT(period) ON TABLE outbox.rate_slots TO outbox_dispatcher;
GRANT SELECT(next_at),UPDATE(next_at) ON TABLE outbox.rate_slots TO outbox_dispatcher;

-- on table retention_rules
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.retention_rules TO outbox_operator;

-- on table schema_migrations
GRANT SELECT ON TABLE outbox.schema_migrations TO outbox_dispatcher;
GRANT SELECT ON TABLE outbox.schema_migrations TO outbox_operator;

-- on table tenants
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.tenants TO outbox_operator;
GRANT SELECT(id) ON TABLE outbox.tenants TO outbox_producer;
GRANT SELECT(external_id) ON TABLE outbox.tenants TO outbox_producer;

-- on table unseated_requests
GRANT DELETE ON TABLE outbox.unseated_requests TO outbox_dispatcher;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE outbox.unseated_requests TO outbox_operator;
GRANT SELECT(message_id) ON TABLE outbox.unseated_requests TO outbox_dispatcher;
GRANT SELECT(destination),UPDATE(destination) ON TABLE outbox.unseated_requests TO outbox_dispatcher;
