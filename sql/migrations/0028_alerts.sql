-- 0028: alerts, the outbox's own operational events, sent as webhooks through
-- the outbox itself to the endpoints that subscribe to them.
--
--   outbox.message.dead        a message went dead (UPDATE of messages)
--   outbox.endpoint.disabled   an endpoint was disabled (UPDATE of endpoints)
--   outbox.breaker.opened      a destination's circuit breaker opened
--   outbox.breaker.closed      ... and closed again (destination_health)
--   outbox.lag.exceeded        the oldest due message waited past a dispatcher's
--   outbox.lag.recovered       --lag-alert, and later no longer (alert_lag)
--   outbox.secrets.unknown_key a dispatcher met a secret sealed under a key it
--                              lacks (alert_unknown_key)
--
-- The first four are raised by triggers, in the transaction that makes the
-- change, so no alert is lost to a crash between the change and its alert, and
-- none is raised for a change that rolls back. A message goes dead only by an
-- UPDATE (every insert writes 'ready': enqueue, publish, replay, test events):
-- the completion of an attempt, the rescue of an expired lease, the deletion of
-- its endpoint (endpoint_detach, and tenants' deletion through it), an
-- operator's cancel. A breaker opens by an INSERT (health_open) or by the
-- UPDATE of a hold (held -> open), and closes by a DELETE (health_close); a
-- failed probe (probing -> open) is the same opening, not a new one. Each
-- trigger has a WHEN clause that only the change itself passes, so a claim, a
-- renewal or a completion that changes no such state pays for the clause alone.
-- The two others are raised by dispatchers (dispatchers.runtime.alerts),
-- through the functions at the end, which their role may execute.
--
-- An alert is published as publish publishes an event (the same fan-out,
-- _fan_out below, which publish now calls too): a Standard Webhooks envelope,
-- one message per endpoint keyed "<event key>:<endpoint id>", the event
-- recorded once per key. But only to
-- - endpoints of no tenant (alerts are the operator's, whoever's endpoint
--   they are about; the payload names its tenant);
-- - that subscribe to the type by its name or a pattern ("outbox.*"): an
--   endpoint with no event types, which gets every event published, gets no
--   alert; and a payload filter (JMESPath, evaluated in Python only) does not
--   apply to alerts, which are sent whatever it says;
-- - other than the endpoint the alert is about: its own failure raised it.
-- publish refuses the outbox.* types, so that an alert is always the outbox's.
-- An alert about a message that is itself an alert (or a test event: every
-- outbox.* type) is never raised, so alerts cannot raise alerts without end.
-- Each occurrence has its own event key (a message's id and attempt, an
-- endpoint's disabled_at, a breaker's opened_at, a crossing's time, a key id
-- and hour), so a transition replayed writes nothing twice; an alert that
-- finds no endpoint to take it writes nothing at all (not even its event).
-- Alert messages have at most 8 attempts, and their types a short retry
-- schedule of their own (10 s, 1 min, 5 min, 15 min, then hourly; operators
-- may change it with outbox event-types set).
--
-- The trigger functions and alert_lag / alert_unknown_key are SECURITY
-- DEFINER with search_path pinned as publish's (0022): they write as the
-- schema's owner, so the dispatcher and the operator need no privilege on
-- events or message_keys, nor INSERT on messages, for the alerts their
-- statements raise. EXECUTE is revoked from PUBLIC; `outbox roles` grants the
-- dispatcher EXECUTE on alert_lag and alert_unknown_key (a trigger's function
-- is not checked for EXECUTE when it fires).

-- ---------------------------------------------------------------------------
-- What publish and alerts share.

-- The Standard Webhooks envelope of an event whose payload is the compact
-- JSON text "data" (the timestamp as outbox._core writes it).
CREATE FUNCTION _envelope(event_type text, data text) RETURNS bytea
LANGUAGE sql VOLATILE
AS $$
    SELECT convert_to(
        '{"type":' || to_jsonb(event_type)::text
        || ',"timestamp":"'
        || to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"+00:00"')
        || '","data":' || data || '}', 'UTF8')
$$;

-- An event's digest (outbox._digest.event_digest): its type and payload text.
CREATE FUNCTION _event_digest(event_type text, data text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT sha256(convert_to('outbox.event.v1', 'UTF8')
                  || _digest_field(convert_to(event_type, 'UTF8'))
                  || _digest_field(convert_to(data, 'UTF8')))
$$;

-- Fan an event out (sql/queries/enqueue.sql's publish, but for filters): one
-- message per enabled endpoint of the tenant (0: none) subscribed to its type,
-- but "passed_over", keyed "<event key>:<endpoint id>", and the event recorded
-- once per key. An endpoint with no event types takes every type but the
-- outbox's own (outbox.*). An endpoint's JMESPath filter runs in Python: for
-- an event of the application's, a subscribed endpoint with one writes
-- nothing and is returned (filtered_endpoint), for publish to refuse the event
-- (OB003) rather than have it sent unjudged or silently left out; alerts are
-- sent whatever their filters say. created_ids: the messages written, NULL
-- when the event key was recorded before (by a transaction that committed, or
-- that this one waited for), or when nothing was to be written and
-- "record_empty" is false (an alert nobody takes leaves no record).
CREATE FUNCTION _fan_out(
    event_type text,
    event_key text,
    digest bytea,
    body bytea,
    tenant_id bigint,
    ordering_key text,
    max_attempts integer,
    trace_context jsonb,
    passed_over bigint,
    record_empty boolean,
    OUT created_ids bigint[],
    OUT filtered_endpoint bigint
)
LANGUAGE plpgsql VOLATILE
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
            LIMIT 1
        ) AS k ON true
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
    ), new_event AS (
        INSERT INTO events (tenant_id, event_key, event_type, digest, message_ids)
        SELECT _fan_out.tenant_id, _fan_out.event_key, _fan_out.event_type, _fan_out.digest,
               ARRAY(SELECT message_id FROM planned ORDER BY message_id)
        WHERE NOT EXISTS (SELECT FROM filtered WHERE id IS NOT NULL)
          AND (_fan_out.record_empty OR EXISTS (SELECT FROM planned))
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

-- publish as 0024 made it, with its fan-out in _fan_out, and refusing the
-- outbox's own event types (as outbox._core does, in the same place).
CREATE OR REPLACE FUNCTION publish(
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

-- ---------------------------------------------------------------------------
-- Raising an alert.

-- Whether an endpoint's subscriptions name an outbox.* type or pattern.
CREATE FUNCTION _takes_alerts(event_types text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT EXISTS (SELECT FROM unnest(event_types) AS t WHERE starts_with(t, 'outbox.')) $$;

-- The endpoints that may take alerts, usually none or a few: whether any
-- does is one probe of this index, so a change that would raise an alert
-- nobody takes costs about that (the fan-out reads every endpoint of no
-- tenant). Only disabling an endpoint changes a column it names ("enabled"),
-- so the health updates of completions stay heap-only as before.
CREATE INDEX endpoints_alerts_idx ON endpoints (id)
    WHERE tenant_id IS NULL AND enabled AND _takes_alerts(event_types);

CREATE FUNCTION _alerts_wanted() RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT FROM endpoints AS e
                   WHERE e.tenant_id IS NULL AND e.enabled AND _takes_alerts(e.event_types))
$$;

-- A time as alerts write it: UTC, ISO 8601, to the microsecond (event keys
-- hold it, so two occurrences never share one).
CREATE FUNCTION _alert_time(at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;

-- A text as part of an event key: itself when short and printable, else a
-- digest of it, so that every alert's key stays within an event key's 200
-- characters (a destination may be a URL's origin of 270).
CREATE FUNCTION _alert_key_part(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN length(value) <= 100 AND value ~ '^[!-~]+$' THEN value
                ELSE 'sha256:' || left(encode(sha256(convert_to(value, 'UTF8')), 'hex'), 32)
           END
$$;

-- The tenant's external id of a destination "endpoint:<id>" (NULL for none).
CREATE FUNCTION _alert_tenant(endpoint_id bigint) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT t.external_id FROM endpoints AS e JOIN tenants AS t ON t.id = e.tenant_id
    WHERE e.id = endpoint_id
$$;

-- The endpoint a destination names ("endpoint:<id>"), or NULL (a URL's origin).
CREATE FUNCTION _alert_endpoint(destination text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN destination ~ '^endpoint:[0-9]{1,18}$' THEN substr(destination, 10)::bigint END
$$;

-- Publish the alert event_type (outbox.*) with the payload "data", once per
-- event_key, to the endpoints of no tenant that subscribe to it, but
-- passed_over (the endpoint it is about). Writes nothing when none does.
-- Returns the messages written.
CREATE FUNCTION _alert(event_type text, event_key text, data jsonb, passed_over bigint)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
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

-- ---------------------------------------------------------------------------
-- The triggers.

CREATE FUNCTION alert_message_dead() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
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

CREATE TRIGGER messages_alert_dead
    AFTER UPDATE OF state ON messages
    FOR EACH ROW
    WHEN (NEW.state = 'dead' AND OLD.state <> 'dead'
          AND (NEW.event_type IS NULL OR NOT starts_with(NEW.event_type, 'outbox.')))
    EXECUTE FUNCTION alert_message_dead();

CREATE FUNCTION alert_endpoint_disabled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    v_at timestamptz := COALESCE(NEW.disabled_at, now());
BEGIN
    IF _alerts_wanted() THEN
        PERFORM _alert('outbox.endpoint.disabled',
                       'outbox.endpoint.disabled:' || NEW.id || ':' || _alert_time(v_at),
                       jsonb_build_object(
                           'endpoint_id', NEW.id,
                           'tenant', _alert_tenant(NEW.id),
                           'description', left(NEW.description, 200),
                           -- scheme, host and port: a URL's path may hold a token
                           'origin', substring(NEW.url FROM '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*'),
                           'reason', left(NEW.disabled_reason, 500),
                           'failure_streak', NEW.failure_streak,
                           'failing_since', _alert_time(NEW.failing_since),
                           'last_success_at', _alert_time(NEW.last_success_at),
                           'disabled_at', _alert_time(v_at)),
                       NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER endpoints_alert_disabled
    AFTER UPDATE OF enabled ON endpoints
    FOR EACH ROW
    WHEN (OLD.enabled AND NOT NEW.enabled)
    EXECUTE FUNCTION alert_endpoint_disabled();

CREATE FUNCTION alert_breaker() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
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

CREATE TRIGGER destination_health_alert_opened
    AFTER INSERT ON destination_health
    FOR EACH ROW
    WHEN (NEW.state = 'open')
    EXECUTE FUNCTION alert_breaker();

CREATE TRIGGER destination_health_alert_hold_opened
    AFTER UPDATE OF state ON destination_health
    FOR EACH ROW
    WHEN (OLD.state = 'held' AND NEW.state = 'open')
    EXECUTE FUNCTION alert_breaker();

CREATE TRIGGER destination_health_alert_closed
    AFTER DELETE ON destination_health
    FOR EACH ROW
    WHEN (OLD.state <> 'held')
    EXECUTE FUNCTION alert_breaker();

-- ---------------------------------------------------------------------------
-- The alerts dispatchers raise.

-- Conditions that alert once as they begin and once as they end, whichever
-- dispatcher sees it first: the row of each is changed under its lock, so of
-- two dispatchers that see one crossing, one changes it (and alerts) and the
-- other, having waited for it, finds it changed.
CREATE TABLE alert_conditions (
    condition  text        PRIMARY KEY,
    active     boolean     NOT NULL,
    since      timestamptz NOT NULL
);

-- A dispatcher run with --lag-alert reports how long the oldest message due
-- has waited (oldest_s, of "destination"), and its threshold: past the
-- threshold, the lag is exceeded; at half of it or less, recovered (between
-- the two, it stays as it was, so that a lag hovering about the threshold
-- does not alert at every turn). Returns 'exceeded' or 'recovered' when this
-- call changed it, else NULL.
CREATE FUNCTION alert_lag(oldest_s double precision, threshold_s double precision,
                          destination text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
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

-- A dispatcher met a secret (a signing secret, a client key, an endpoint's
-- credentials) sealed under a key it lacks: alert once per key id and hour
-- (UTC), whichever dispatcher meets it first and however many do. Returns the
-- messages written (none when the alert of that hour was raised already).
CREATE FUNCTION alert_unknown_key(key_id text, endpoint_id bigint, dispatcher text DEFAULT NULL)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
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

-- ---------------------------------------------------------------------------
-- Their retry schedule: 10 s, 1 min, 5 min, 15 min, then hourly (8 attempts,
-- about three and a half hours). An operator's own schedule for a type stays.
INSERT INTO event_types (event_type, retry_schedule)
SELECT t, '{10, 60, 300, 900, 3600}'
FROM unnest(ARRAY['outbox.message.dead', 'outbox.endpoint.disabled', 'outbox.breaker.opened',
                  'outbox.breaker.closed', 'outbox.lag.exceeded', 'outbox.lag.recovered',
                  'outbox.secrets.unknown_key']) AS t
ON CONFLICT (event_type) DO NOTHING;

-- EXECUTE for no one; `outbox roles` grants alert_lag and alert_unknown_key to
-- the dispatcher. But for _takes_alerts: every role that writes an endpoint
-- evaluates it, in the predicate of endpoints_alerts_idx. publish (replaced above, which drops its settings) and the
-- functions that run as the owner get their search path pinned again.
DO $migration$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('_envelope', '_event_digest', '_fan_out',
                            '_alerts_wanted', '_alert_time', '_alert_key_part', '_alert_tenant',
                            '_alert_endpoint', '_alert', 'alert_message_dead',
                            'alert_endpoint_disabled', 'alert_breaker', 'alert_lag',
                            'alert_unknown_key')
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', routine);
    END LOOP;
    FOR routine IN
        SELECT p.oid::regprocedure
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('publish', 'alert_message_dead', 'alert_endpoint_disabled',
                            'alert_breaker', 'alert_lag', 'alert_unknown_key')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                       routine, current_schema());
    END LOOP;
END
$migration$;
