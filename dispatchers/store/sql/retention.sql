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

-- name: backlog
-- The backlog for /metrics: per destination, the ready messages due now (at
-- most %(cap)s counted per destination) and how long the oldest of them has
-- been due, as the claim sees them (a destination that a hold or an open
-- breaker blocks has none due; a disabled endpoint's messages are paused, not
-- ready). The %(top)s destinations with the most come one row each, the rest
-- summed in one row whose destination is NULL, so that the answer is bounded
-- whatever the number of destinations.
--
-- Its cost is bounded by the destinations with ready messages, not by the
-- backlog: the claimable index (destination, available_at, id) is walked one
-- destination at a time (each found by one probe past the last), its oldest
-- message is the first entry, and its count stops at the cap.
WITH RECURSIVE destinations AS (
    (SELECT m.destination FROM {schema}.messages AS m
     WHERE m.state = 'ready' ORDER BY m.destination LIMIT 1)
    UNION ALL
    SELECT (SELECT m.destination FROM {schema}.messages AS m
            WHERE m.state = 'ready' AND m.destination > d.destination
            ORDER BY m.destination LIMIT 1)
    FROM destinations AS d
    WHERE d.destination IS NOT NULL
), due AS (
    SELECT d.destination, c.ready, o.oldest
    FROM destinations AS d
    CROSS JOIN LATERAL (
        SELECT count(*) AS ready
        FROM (SELECT 1 FROM {schema}.messages AS m
              WHERE m.state = 'ready' AND m.destination = d.destination
                AND m.available_at <= now()
              LIMIT %(cap)s) AS counted
    ) AS c
    CROSS JOIN LATERAL (
        SELECT m.available_at AS oldest FROM {schema}.messages AS m
        WHERE m.state = 'ready' AND m.destination = d.destination
        ORDER BY m.available_at LIMIT 1
    ) AS o
    WHERE d.destination IS NOT NULL AND c.ready > 0
      AND NOT EXISTS (
        SELECT 1 FROM {schema}.destination_health AS dh
        WHERE dh.destination = d.destination AND dh.blocked_until > now())
), ranked AS (
    SELECT due.*, row_number() OVER (ORDER BY due.ready DESC, due.destination) AS rank
    FROM due
)
SELECT CASE WHEN r.rank <= %(top)s THEN r.destination END AS destination,
       CAST(sum(r.ready) AS bigint) AS ready,
       CAST(EXTRACT(EPOCH FROM now() - min(r.oldest)) AS double precision) AS oldest_s
FROM ranked AS r
GROUP BY 1

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

-- name: expire_payloads
-- One round of the retention rules (migration 0029): for each rule, one batch
-- of delivered messages past its period erased. The function runs as the
-- schema's owner: a dispatcher may not otherwise change a body.
SELECT e.rule_id, e.erased
FROM {schema}.expire_payloads(%(limit)s, %(marker)s) AS e
