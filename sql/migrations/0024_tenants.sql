-- 0024: tenants, the customers of a product that sends them webhooks.
--
-- A tenant is named by an id its product chooses ("customer-17", external_id)
-- and owns endpoints; an endpoint belongs to at most one tenant, and one with
-- none belongs to the operator (every endpoint made before this migration).
-- publish with a tenant fans out to that tenant's endpoints only; publish
-- without one, to the endpoints with none. A tenant's endpoints never receive
-- an event published for nobody or for another tenant.
--
-- The fan-out reads endpoints_fanout_idx: one probe of the tenant's key (0 for
-- none, so that one generic plan serves both), then that tenant's endpoints
-- only. Its cost depends on the endpoints of the tenant, not on how
-- many there are in all.
--
-- A tenant's rate limit and retry schedule are the defaults of the endpoints
-- added to it (copied at creation, as an operator would type them): each
-- endpoint keeps its own policy, read by the claim from its own row.
--
-- An event key is the tenant's own: two customers may each publish "order-1".
-- events is keyed by (tenant_id, event_key), tenant_id 0 for none; the primary
-- key index is rebuilt, which holds the events table's lock while it builds.
CREATE TABLE tenants (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    external_id       text NOT NULL UNIQUE
        CHECK (external_id ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    name              text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    rate_limit_per_s  rate_limit,
    rate_burst        slot_number,
    retry_schedule    retry_schedule,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit_per_s IS NULL) = (rate_burst IS NULL))
);

ALTER TABLE endpoints ADD COLUMN tenant_id bigint REFERENCES tenants (id);

-- Not partial: the planner reads the statistics of an index's expression only
-- when the index has no predicate, and without them it guesses that one
-- tenant's key matches 0.5% of all endpoints (500 of 100,000), which makes the
-- generic plan of publish look costlier than it is, and each call planned anew.
CREATE INDEX endpoints_fanout_idx ON endpoints ((COALESCE(tenant_id, 0)), id);
-- every endpoint of a tenant, enabled or not (its pages, its deletion)
CREATE INDEX endpoints_tenant_idx ON endpoints (tenant_id, id) WHERE tenant_id IS NOT NULL;

ALTER TABLE events ADD COLUMN tenant_id bigint NOT NULL DEFAULT 0;
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events ADD PRIMARY KEY (tenant_id, event_key);

-- publish gains its tenant (the last argument, so that calls by name and by
-- position written for 0022 mean what they meant), and keys events by it
DROP FUNCTION publish(text, jsonb, text, text, integer, text, text, boolean);

CREATE FUNCTION publish(
    event_type text,
    payload jsonb,
    idempotency_key text DEFAULT NULL,
    ordering_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    notify boolean DEFAULT true,
    tenant text DEFAULT NULL
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
    v_tenant bigint := 0;
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
    -- sql/queries/enqueue.sql's publish, but for filters: an endpoint's JMESPath
    -- filter runs in Python, so a subscribed endpoint with one refuses the event
    -- (OB003) rather than have it sent unjudged or silently left out
    WITH subscribed AS (
        SELECT e.id, e.filter,
               'endpoint:' || e.id AS target,
               v_key || ':' || e.id AS idempotency_key
        FROM endpoints AS e
        WHERE e.enabled
          AND COALESCE(e.tenant_id, 0) = v_tenant
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
        INSERT INTO events (tenant_id, event_key, event_type, digest, message_ids)
        SELECT v_tenant, v_key, publish.event_type, v_digest,
               ARRAY(SELECT message_id FROM planned ORDER BY message_id)
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
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
    SELECT e.message_ids, e.digest INTO v_found FROM events AS e
    WHERE e.tenant_id = v_tenant AND e.event_key = v_key;
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

DO $migration$
BEGIN
    EXECUTE 'REVOKE ALL ON FUNCTION publish FROM PUBLIC';
    EXECUTE format('ALTER FUNCTION publish SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END
$migration$;
