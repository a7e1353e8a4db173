-- The dispatcher's housekeeping (dispatchers.store.postgres): the removal of
-- old history, and for --drain, what is left to do.
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- name: retention
-- Remove one bounded batch of history: delivered messages completed before the
-- retention period, with their attempt rows and idempotency keys (so the dedupe
-- window of a key is the retention period). Dead messages are kept until purged.
-- Also one batch of events published before the retention period (publish's
-- once-per-event record; its window is the retention period too). Returns both
-- counts, so that the caller goes on while either batch was full.
-- SKIP LOCKED lets every dispatcher run it without waiting on the others.
WITH old AS (
    SELECT id
    FROM {schema}.delivered
    WHERE completed_at < now() - make_interval(secs => %(retention_s)s)
    ORDER BY completed_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), removed AS (
    DELETE FROM {schema}.delivered AS d
    USING old
    WHERE d.id = old.id
    RETURNING d.id, d.target, d.idempotency_key
), keys AS (
    -- by the key's primary key: a history row keeps its target and key
    DELETE FROM {schema}.message_keys AS k
    USING removed
    WHERE k.target = removed.target
      AND k.idempotency_key = removed.idempotency_key
      AND k.message_id = removed.id
), attempt_rows AS (
    DELETE FROM {schema}.attempts AS a
    USING removed
    WHERE a.message_id = removed.id
), old_events AS (
    SELECT tenant_id, event_key
    FROM {schema}.events
    WHERE created_at < now() - make_interval(secs => %(retention_s)s)
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), events_removed AS (
    DELETE FROM {schema}.events AS e
    USING old_events
    WHERE e.tenant_id = old_events.tenant_id AND e.event_key = old_events.event_key
    RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS history,
       (SELECT count(*) FROM events_removed) AS events

-- fragment: destination_blocked
-- A message m whose destination a hold or an open breaker blocks now.
-- A condition on the message "m"; it needs no CTE.
EXISTS (
    SELECT 1 FROM {schema}.destination_health AS dh
    WHERE dh.destination = m.destination AND dh.blocked_until > now())

-- name: work_remaining
-- For --drain: is anything due now or in flight, and how much is scheduled later.
-- "Due" skips what claim skips: a ready webhook whose endpoint is disabled (one
-- committed after the disable paused the rest) waits, and must not keep a drain
-- from ever finishing; the messages of a destination that a hold or an open
-- breaker blocks count as scheduled later, as retries do.
SELECT
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND m.available_at <= now()
       AND (m.endpoint_id IS NULL OR EXISTS (
             SELECT 1 FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id AND e.enabled))
       AND NOT {destination_blocked})
        AS due,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'running') AS running,
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND (m.available_at > now() OR {destination_blocked}))
        AS scheduled
