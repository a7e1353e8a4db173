-- The dispatcher's housekeeping (dispatchers.store.postgres): the removal of
-- old history (the partitions of delivered and attempts made ahead and dropped
-- whole, the rest in batches), and for --drain, what is left to do.
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- name: retention
-- Remove one bounded batch of the history that is not dropped a partition at a
-- time: delivered messages completed before the retention period and below
-- %(delivered_floor)s, the lower bound of the oldest partition of a range
-- (migration 0032; NULL when there is none), which leaves the rows of the
-- legacy partition (the table as it was before the partitioning) and of the
-- default one; with their attempt rows (below %(attempts_floor)s, likewise).
-- Both bounds are values, so the plan reads those partitions only. Dead
-- messages are kept until purged. Idempotency keys and event records are not
-- deleted: they go a generation at a time (key_generation_turn, migration
-- 0033). Returns the count, so that the caller goes on while a batch was full.
-- SKIP LOCKED lets every dispatcher run it without waiting on the others.
WITH old AS (
    SELECT id
    FROM {schema}.delivered
    WHERE completed_at < now() - make_interval(secs => %(retention_s)s)
      AND completed_at < COALESCE(CAST(%(delivered_floor)s AS timestamptz), 'infinity')
    ORDER BY completed_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), removed AS (
    DELETE FROM {schema}.delivered AS d
    USING old
    WHERE d.id = old.id
      AND d.completed_at < COALESCE(CAST(%(delivered_floor)s AS timestamptz), 'infinity')
    RETURNING d.id
), attempt_rows AS (
    DELETE FROM {schema}.attempts AS a
    USING removed
    WHERE a.message_id = removed.id
      AND a.started_at < COALESCE(CAST(%(attempts_floor)s AS timestamptz), 'infinity')
)
SELECT count(*) AS history FROM removed

-- name: history_partitions
-- The partitions of delivered and attempts with their bounds (NULL: MINVALUE
-- below; the default partition has neither), oldest first (migration 0032).
SELECT parent, partition, lower, upper, is_default
FROM {schema}.history_partitions()

-- name: history_extend
-- Make up to %(most)s of the partitions missing up to %(ahead_s)s from now, each
-- one %(step)s long; returns those made (none while another dispatcher makes
-- them). Sent under a short lock_timeout
-- (dispatchers.store.postgres.DDL_LOCK_TIMEOUT).
SELECT made
FROM {schema}.history_extend(make_interval(secs => %(ahead_s)s), %(step)s, %(most)s) AS made

-- name: key_generation_turn
-- Turn the generation of idempotency keys and event records if it is due (the
-- carry into the current one was done at least the retention period ago):
-- the previous tables are dropped, the current ones become the previous ones
-- (migration 0033). Returns the new generation, or NULL. Sent under a short
-- lock_timeout, as history_extend: producers wait behind it that long at most.
SELECT {schema}.key_generation_turn(make_interval(secs => %(retention_s)s)) AS generation

-- name: key_generation_carry
-- After a turn: copy the keys of up to %(limit)s messages still in messages
-- from the previous generation into the current one. Returns the messages read
-- (fewer than %(limit)s: the carry is done), or NULL when none is to be carried.
SELECT {schema}.key_generation_carry(%(limit)s) AS carried

-- name: history_drop
-- Drop a partition whose whole range ended before the retention period (the
-- function checks it; false for any other name). Its idempotency keys go with
-- their generation (key_generation_turn). Sent under a short
-- lock_timeout, as history_extend.
SELECT {schema}.history_drop(%(partition)s, make_interval(secs => %(retention_s)s)) AS dropped

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
-- of delivered messages past its period erased, their bodies the erasure's
-- marker (migration 0034). The function runs as the schema's owner: a
-- dispatcher may not otherwise change a body.
SELECT e.rule_id, e.erased
FROM {schema}.expire_payloads(%(limit)s) AS e
