-- 0029: payload retention per endpoint and per event type.
--
-- The dispatcher's --retention keeps the delivery record (the history row, its
-- attempts and its key) for one period, whole. A rule here keeps what the
-- delivered messages of one endpoint, or of one event type, said for a shorter
-- time: past it, their bodies and headers, and the receivers' answers recorded
-- with their attempts, are replaced by the marker of `outbox expunge` (0025),
-- and the record stays until the history's own retention removes it. Erasure
-- rather than hiding: data a customer asked to be kept a day is gone after a
-- day, not merely out of sight, and the removal of whole history rows stays
-- one cut by time for every row (the shape partitions by time need).
--
-- When both an endpoint's rule and its event type's apply, the shorter does.
-- Messages still in the hot table (dead ones kept for redrive) are left alone:
-- their payload is what a redrive sends.
CREATE TABLE retention_rules (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id          bigint UNIQUE REFERENCES endpoints (id) ON DELETE CASCADE,
    event_type           text UNIQUE,
    payload_retention_s  double precision NOT NULL
                         -- a minute at least (a completion committed late must not slip behind
                         -- erased_until); NaN is greater than every number, so it fails the bound
                         CHECK (payload_retention_s >= 60 AND payload_retention_s <= 3153600000),
    -- how far the erasure has gone: every delivered message of the rule that
    -- completed before this was erased (or was past the rule when it came), so
    -- each round reads only what completed since, not the whole history again
    erased_until         timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (num_nonnulls(endpoint_id, event_type) = 1)
);

ALTER TABLE expunges DROP CONSTRAINT expunges_scope_check;
ALTER TABLE expunges ADD CONSTRAINT expunges_scope_check
    CHECK (scope IN ('event', 'endpoint', 'key', 'retention'));

-- One round of erasure, run by every dispatcher's retention: for each rule
-- (one dispatcher at a time per rule: SKIP LOCKED), up to "batch" delivered
-- messages that completed past the rule's period and were not erased yet; each
-- erasure recorded in expunges with its count. Returns each rule it served and
-- how many it erased; a caller goes on while one returns a full batch.
--
-- An endpoint's messages are found by delivered_endpoint_idx (endpoint_id,
-- completed_at), an event type's by delivered_completed_idx, both from the
-- rule's erased_until on: the rows a round reads are the ones completed since
-- the last. It runs as the schema's owner, so that the dispatcher, which may
-- not change a message's body, can be granted this and nothing more.
CREATE FUNCTION expire_payloads(batch integer, marker bytea)
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
            SET body = marker, headers = '{}', expunged_at = now()
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

REVOKE ALL ON FUNCTION expire_payloads(integer, bytea) FROM PUBLIC;

DO $migration$
BEGIN
    EXECUTE format('ALTER FUNCTION expire_payloads(integer, bytea) '
                   'SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$migration$;
