-- 0034: what a role may write never steers a delivery, and no function takes
-- an argument that widens what its caller may do.
--
-- 1. A message that names an endpoint names no URL, and its destination is
--    the endpoint's ("endpoint:<id>"). The dispatcher sends an endpoint's
--    message to the endpoint's URL with the endpoint's credentials and secret;
--    a row with both let a role that may insert messages (the producer) send
--    them to a URL of its own.
-- 2. Types under "outbox." (the alerts), and plain messages of an endpoint's
--    destination (which would share its caps and open its breaker with their
--    own failures), are written only by the outbox itself: the alert triggers
--    and the SQL producers (as the schema's owner), or a role that may change
--    an endpoint's URL (the operator replaying; it could point the endpoint
--    anywhere anyway, as 0020 reasons). Not by the producer, nor the
--    dispatcher.
-- 3. key_generation_turn and history_drop refuse a retention under an hour:
--    the dispatcher role could otherwise drop every key and event record at
--    once (and events be delivered twice). `outbox dispatch --retention`
--    refuses it too, before it starts.
-- 4. expire_payloads writes the one erasure marker itself, no longer one its
--    caller chose (any content, shown to the tenant in its portal).
-- 5. An endpoint's disabling is alerted once per endpoint per hour, and for a
--    tenant's endpoint without the tenant's own text (its description), with
--    its reason bounded: a tenant that disables and enables its endpoint in a
--    loop reaches the operator's alerting at most hourly, and with no text of
--    its own beyond 200 characters of reason.
-- 6. The management API signs its page cursors with a key of the database's
--    (made here, read by the operator's role), so that a cursor made by one
--    `outbox ui` process is taken by every other, and after a restart, and
--    one a client altered is refused.
-- 7. A producer finds a key it writes by the key itself, through key_lookup
--    and key_taken_before, which run as the owner, and reads no other: it read
--    every plain message's URL, query string included, in message_keys.target.
--    (Its table grants keep only the insert of a key and the id returned.)
-- 8. Every function of the schema runs with its search path pinned: a role
--    that may create objects in a schema on the caller's search path (public,
--    before PostgreSQL 15) can no longer stand its own function in for one
--    the trigger endpoint_enable_check calls.

-- 1 ---------------------------------------------------------------------------
-- Rows written before this (by a role that may insert messages, or by an older
-- version) that name both keep their endpoint: they go to its URL. (A deleted
-- endpoint's messages keep its URL and name no endpoint: endpoint_detach.)
UPDATE messages SET url = NULL WHERE endpoint_id IS NOT NULL AND url IS NOT NULL;
UPDATE messages SET destination = 'endpoint:' || endpoint_id
WHERE endpoint_id IS NOT NULL AND destination <> 'endpoint:' || endpoint_id;

ALTER TABLE messages
    ADD CONSTRAINT messages_endpoint_alone
        CHECK (endpoint_id IS NULL OR (url IS NULL AND destination = 'endpoint:' || endpoint_id));

-- 2 ---------------------------------------------------------------------------
-- What only a role that may change an endpoint's URL may insert: a message of
-- a type under "outbox.", and a message of no endpoint whose destination is
-- an endpoint's (it would share that endpoint's caps and breaker). SECURITY
-- INVOKER on purpose: it asks what the role that inserts may do; a SECURITY
-- DEFINER function that inserts (the alert triggers, publish) is the owner.
CREATE FUNCTION message_insert_check() RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER
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

-- considered for every insert, run only for the two cases
CREATE TRIGGER messages_insert_check
    BEFORE INSERT ON messages
    FOR EACH ROW
    WHEN (starts_with(NEW.event_type, 'outbox.')
          OR (NEW.endpoint_id IS NULL AND starts_with(NEW.destination, 'endpoint:')))
    EXECUTE FUNCTION message_insert_check();

-- 3 ---------------------------------------------------------------------------
-- The shortest retention a caller of the functions below may ask for.
CREATE FUNCTION _retention_floor(retention interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF retention IS NULL OR retention < interval '1 hour' THEN
        RAISE EXCEPTION 'retention must be at least an hour, got %', retention
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- As 0033 made it, but for the floor of the retention.
CREATE OR REPLACE FUNCTION key_generation_turn(retention interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
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

-- As 0032 made it, but for the floor of the retention.
CREATE OR REPLACE FUNCTION history_drop(partition text, retention interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
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

-- 4 ---------------------------------------------------------------------------
-- As 0029 made it, but its marker is the erasure's own (outbox/_expunge.py's
-- EXPUNGED_BODY), not its caller's.
DROP FUNCTION expire_payloads(integer, bytea);

CREATE FUNCTION expire_payloads(batch integer)
RETURNS TABLE (rule_id bigint, erased integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
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

-- 5 ---------------------------------------------------------------------------
-- As 0028 made it, but keyed by the hour (a second disabling within it is the
-- same event, published once), and without a tenant's own text.
CREATE OR REPLACE FUNCTION alert_endpoint_disabled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
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

-- 6 ---------------------------------------------------------------------------
-- 256 random bits: two version 4 UUIDs have 244, from PostgreSQL's strong source.
CREATE TABLE api_cursor_key (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    key  bytea   NOT NULL
);
INSERT INTO api_cursor_key (key)
VALUES (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));

-- 7 ---------------------------------------------------------------------------
-- The message and digest of key (target, idempotency_key), in the current
-- generation or the previous one (0033); no row if neither holds it. STABLE:
-- it reads with its caller's snapshot, as the statement it stands in did.
-- PL/pgSQL, whose plans are kept for the session: a SQL function's would be
-- made again at every call.
CREATE FUNCTION key_lookup(target text, idempotency_key text)
RETURNS TABLE (message_id bigint, digest bytea)
LANGUAGE plpgsql STABLE SECURITY DEFINER
ROWS 1  -- a key names one message: the planner's default of 1000 would cost
        -- publish's look-up of each endpoint's key as a thousand rows
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

-- Whether the previous generation holds key (target, idempotency_key): enqueue
-- writes a key into the current one unless it does (the current one's primary
-- key refuses it there).
CREATE FUNCTION key_taken_before(target text, idempotency_key text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM message_keys_old AS k
                   WHERE k.target = key_taken_before.target
                     AND k.idempotency_key = key_taken_before.idempotency_key);
END
$$;

-- 8 ---------------------------------------------------------------------------
-- Only their owner may call the new functions but the trigger's (which runs
-- as whoever inserts, and is refused to none); `outbox roles` grants expire_payloads to the
-- dispatcher, key_lookup and key_taken_before to the producer. Every function of the schema gets its search path pinned.
REVOKE ALL ON FUNCTION _retention_floor(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION expire_payloads(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION key_lookup(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION key_taken_before(text, text) FROM PUBLIC;

DO $migration$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND NOT EXISTS (SELECT FROM unnest(p.proconfig) AS c
                          WHERE starts_with(c, 'search_path='))
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                       routine, current_schema());
    END LOOP;
END
$migration$;
