-- Every statement that touches the outbox tables, by name.
--
-- "{schema}" is replaced by the quoted schema identifier when the queries are
-- loaded (psycopg.sql.Identifier); parameters use psycopg's %(name)s style and are
-- translated for SQLAlchemy's text() by outbox.queries.

-- name: enqueue
-- Insert the key first: if (target, key) exists already, the key insert does
-- nothing, so the message insert (which selects from it) does nothing too, and
-- the caller looks the existing id up with enqueue_existing. A concurrent
-- transaction holding the same key makes this statement wait for its outcome.
-- {notify} is either empty or a pg_notify call with a constant payload (so that
-- PostgreSQL folds all notifications of one transaction into one), made only
-- when a dispatcher is waiting for it (outbox.queries.Queries explains how).
WITH new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    VALUES (%(target)s, %(idempotency_key)s, nextval('{schema}.messages_id_seq'))
    ON CONFLICT (target, idempotency_key) DO NOTHING
    RETURNING message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts, available_at
    )
    SELECT new_key.message_id,
           CAST(%(idempotency_key)s AS text), CAST(%(target)s AS text),
           CAST(%(endpoint_id)s AS bigint), CAST(%(url)s AS text),
           CAST(%(method)s AS text), CAST(%(headers)s AS jsonb), CAST(%(body)s AS bytea),
           CAST(%(content_type)s AS text), CAST(%(event_type)s AS text),
           CAST(%(ordering_key)s AS text), CAST(%(state)s AS text),
           CAST(%(max_attempts)s AS integer),
           COALESCE(CAST(%(available_at)s AS timestamptz), now())
    FROM new_key
    RETURNING id
)
SELECT id{notify} FROM new_message

-- name: enqueue_existing
-- Runs as a separate statement after a conflict, so that in READ COMMITTED it
-- sees the row that the concurrent transaction committed.
SELECT message_id AS id
FROM {schema}.message_keys
WHERE target = %(target)s AND idempotency_key = %(idempotency_key)s

-- name: claim
-- Claim up to %(limit)s due messages for one dispatcher, in one statement that
-- commits before any HTTP work starts. The candidates come from the partial
-- claimable index in (available_at, id) order; SKIP LOCKED lets several
-- dispatchers claim side by side without waiting on each other.
-- A message with an ordering key waits while an earlier message of the same key
-- is ready, running or paused; a dead one no longer holds its successors back.
-- attempts + 1 is the fencing token every later write of this claim must match.
-- A webhook message whose endpoint was disabled after it was written waits (the
-- disable pauses the rows it can see; this catches the ones committed later).
WITH candidates AS (
    SELECT m.id, m.endpoint_id, m.available_at
    FROM {schema}.messages AS m
    WHERE m.state = 'ready'
      AND m.available_at <= now()
      AND (m.endpoint_id IS NULL OR EXISTS (
            SELECT 1 FROM {schema}.endpoints AS e
            WHERE e.id = m.endpoint_id
              AND e.enabled
              -- a capped endpoint with every slot taken is skipped, so its
              -- backlog cannot crowd other messages out of the batch
              AND (e.max_concurrency IS NULL OR EXISTS (
                    SELECT 1 FROM {schema}.endpoint_slots AS s
                    WHERE s.endpoint_id = e.id AND s.message_id IS NULL))))
      AND (m.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1
            FROM {schema}.messages AS earlier
            WHERE earlier.ordering_key = m.ordering_key
              AND earlier.id < m.id
              AND earlier.state IN ('ready', 'running', 'paused')))
    ORDER BY m.available_at, m.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), capped AS (
    -- candidates of capped endpoints, numbered per endpoint in claim order
    SELECT c.id, c.endpoint_id,
           row_number() OVER (PARTITION BY c.endpoint_id ORDER BY c.available_at, c.id) AS n
    FROM candidates AS c
    JOIN {schema}.endpoints AS e ON e.id = c.endpoint_id
    WHERE e.max_concurrency IS NOT NULL
), free_slots AS (
    -- free slots of those endpoints; a slot another claimer took since our
    -- snapshot is re-checked on its newest version and drops out
    SELECT s.endpoint_id, s.slot
    FROM {schema}.endpoint_slots AS s
    WHERE s.message_id IS NULL
      AND s.endpoint_id IN (SELECT endpoint_id FROM capped)
      AND s.slot <= (SELECT e.max_concurrency FROM {schema}.endpoints AS e
                     WHERE e.id = s.endpoint_id)
    FOR UPDATE SKIP LOCKED
), numbered_slots AS (
    SELECT endpoint_id, slot, row_number() OVER (PARTITION BY endpoint_id ORDER BY slot) AS n
    FROM free_slots
), granted AS (
    UPDATE {schema}.endpoint_slots AS s
    SET message_id = capped.id
    FROM capped
    JOIN numbered_slots USING (endpoint_id, n)
    WHERE s.endpoint_id = numbered_slots.endpoint_id AND s.slot = numbered_slots.slot
    RETURNING s.message_id
), claimable AS (
    SELECT id FROM candidates WHERE id NOT IN (SELECT id FROM capped)
    UNION ALL
    SELECT message_id FROM granted
), claimed AS (
    -- by primary key, from an array: joined to the CTE instead, the planner
    -- may hash the whole table to find a batch of rows
    UPDATE {schema}.messages AS m
    SET state = 'running',
        lease_owner = %(owner)s,
        lease_until = now() + make_interval(secs => %(lease_s)s),
        attempts = m.attempts + 1
    WHERE m.id = ANY (ARRAY(SELECT id FROM claimable))
    RETURNING m.id, m.idempotency_key, m.url, m.method, m.headers, m.body, m.content_type,
              m.attempts, m.max_attempts, m.endpoint_id, m.event_type, m.created_at,
              m.retry_base, m.available_at, m.ordering_key
)
SELECT c.id, c.idempotency_key, COALESCE(c.url, e.url),
       c.method, c.headers, c.body, c.content_type, c.attempts, c.max_attempts,
       c.endpoint_id, c.event_type, c.created_at, c.retry_base,
       -- the signing secrets still in force (several during a rotation)
       ARRAY(SELECT s.value ->> 'secret'
             FROM jsonb_array_elements(e.secrets) AS s
             WHERE s.value ->> 'expires_at' IS NULL
                OR CAST(s.value ->> 'expires_at' AS timestamptz) > now()),
       c.ordering_key
FROM claimed AS c
LEFT JOIN {schema}.endpoints AS e ON e.id = c.endpoint_id
ORDER BY c.available_at, c.id

-- name: claim_uncapped
-- "claim" for every message that needs no slot: no endpoint, or an endpoint
-- without a concurrency cap (without caps, the common case, that is every
-- message "claim" would take), in the same order, with the same result rows.
-- Without the slot machinery it costs half as much to plan, and less to run
-- (the dispatcher prepares both, once per server connection). When some
-- endpoint has a cap, its messages are passed over and one more row, all NULL,
-- says so: the caller then claims the rest with "claim".
WITH candidates AS (
    SELECT m.id
    FROM {schema}.messages AS m
    WHERE m.state = 'ready'
      AND m.available_at <= now()
      AND (m.endpoint_id IS NULL OR EXISTS (
            SELECT 1 FROM {schema}.endpoints AS e
            WHERE e.id = m.endpoint_id AND e.enabled AND e.max_concurrency IS NULL))
      AND (m.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1
            FROM {schema}.messages AS earlier
            WHERE earlier.ordering_key = m.ordering_key
              AND earlier.id < m.id
              AND earlier.state IN ('ready', 'running', 'paused')))
    ORDER BY m.available_at, m.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), capped AS (
    -- one row if some endpoint has a cap (its messages were passed over)
    SELECT 1 FROM {schema}.endpoints WHERE max_concurrency IS NOT NULL LIMIT 1
), claimed AS (
    -- by primary key, as in "claim"
    UPDATE {schema}.messages AS m
    SET state = 'running',
        lease_owner = %(owner)s,
        lease_until = now() + make_interval(secs => %(lease_s)s),
        attempts = m.attempts + 1
    WHERE m.id = ANY (ARRAY(SELECT id FROM candidates))
    RETURNING m.id, m.idempotency_key, m.url, m.method, m.headers, m.body, m.content_type,
              m.attempts, m.max_attempts, m.endpoint_id, m.event_type, m.created_at,
              m.retry_base, m.available_at, m.ordering_key
)
(SELECT c.id, c.idempotency_key, COALESCE(c.url, e.url),
        c.method, c.headers, c.body, c.content_type, c.attempts, c.max_attempts,
        c.endpoint_id, c.event_type, c.created_at, c.retry_base,
        ARRAY(SELECT s.value ->> 'secret'
              FROM jsonb_array_elements(e.secrets) AS s
              WHERE s.value ->> 'expires_at' IS NULL
                 OR CAST(s.value ->> 'expires_at' AS timestamptz) > now()),
        c.ordering_key
 FROM claimed AS c
 LEFT JOIN {schema}.endpoints AS e ON e.id = c.endpoint_id
 ORDER BY c.available_at, c.id)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM capped

-- name: renew
-- One heartbeat for every lease a dispatcher holds. A row missing from the result
-- is a lost lease (rescued, re-claimed, or completed by someone else).
UPDATE {schema}.messages AS m
SET lease_until = now() + make_interval(secs => %(lease_s)s)
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(attempts)s AS integer[])) AS held(id, attempt)
WHERE m.id = held.id
  AND m.attempts = held.attempt
  AND m.lease_owner = %(owner)s
  AND m.state = 'running'
RETURNING m.id

-- name: complete
-- Write a batch of outcomes in one statement. Every write is fenced by owner,
-- attempt number and state, so an owner whose lease expired (and whose message
-- was claimed again, even by itself) changes nothing. Succeeded messages move to
-- the history table; the others go back to ready (with their delay), to dead, or
-- are released. Attempt rows are written only for fenced-in outcomes that sent a
-- request. Returns the ids whose outcome was applied.
WITH outcome AS (
    SELECT *
    FROM unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(endpoint_ids)s AS bigint[]),
        CAST(%(attempts)s AS integer[]),
        CAST(%(states)s AS text[]),
        CAST(%(delays)s AS double precision[]),
        CAST(%(sent)s AS boolean[]),
        CAST(%(statuses)s AS integer[]),
        CAST(%(outcomes)s AS text[]),
        CAST(%(error_classes)s AS text[]),
        CAST(%(errors)s AS text[]),
        CAST(%(started)s AS timestamptz[]),
        CAST(%(durations)s AS integer[]),
        CAST(%(excerpts)s AS text[])
    ) AS o(id, endpoint_id, attempt, state, delay_s, sent, status, outcome, error_class,
           error, started_at, duration_ms, excerpt)
), health AS (
    -- Endpoint health: per endpoint in this batch, did any attempt succeed, did
    -- any fail, did one answer 410 Gone.
    SELECT endpoint_id,
           bool_or(outcome = 'succeeded') AS any_success,
           count(*) FILTER (WHERE sent AND outcome IN ('retry', 'failed', 'gone')) AS failures,
           bool_or(outcome = 'gone') AS gone
    FROM outcome
    WHERE endpoint_id IS NOT NULL
    GROUP BY endpoint_id
), endpoint_update AS (
    -- A success clears the failure streak; failures extend it. 410 Gone disables
    -- the endpoint at once; failing without a success for disable_after disables
    -- it too. Successes on a healthy endpoint skip the write (hot endpoints would
    -- otherwise serialise every flush on their row).
    UPDATE {schema}.endpoints AS e
    SET failure_streak = CASE WHEN h.any_success THEN 0 ELSE e.failure_streak + h.failures END,
        failing_since = CASE WHEN h.any_success THEN NULL
                             ELSE COALESCE(e.failing_since, now()) END,
        last_success_at = CASE WHEN h.any_success THEN now() ELSE e.last_success_at END,
        enabled = e.enabled AND NOT h.gone AND NOT (
            NOT h.any_success
            AND COALESCE(e.failing_since, now()) < now() - make_interval(secs => %(disable_after_s)s)),
        disabled_reason = CASE
            WHEN NOT e.enabled THEN e.disabled_reason
            WHEN h.gone THEN 'the endpoint answered 410 Gone'
            WHEN NOT h.any_success
                 AND COALESCE(e.failing_since, now()) < now() - make_interval(secs => %(disable_after_s)s)
                THEN 'every attempt failed since ' || to_char(e.failing_since, 'YYYY-MM-DD HH24:MI:SS TZ')
            END,
        disabled_at = CASE WHEN NOT e.enabled THEN e.disabled_at
                           WHEN h.gone OR (NOT h.any_success
                                AND COALESCE(e.failing_since, now())
                                    < now() - make_interval(secs => %(disable_after_s)s))
                           THEN now() END,
        updated_at = now()
    FROM health AS h
    WHERE e.id = h.endpoint_id
      AND (h.gone OR NOT h.any_success OR NOT e.enabled OR e.failure_streak > 0
           OR e.last_success_at IS NULL OR e.last_success_at <= now() - interval '10 seconds')
    RETURNING e.id, e.enabled, e.disabled_at = now() AS newly_disabled, e.disabled_reason
), disabled AS (
    SELECT id FROM endpoint_update WHERE NOT enabled
), paused AS (
    -- Pause the waiting messages of endpoints disabled by this batch.
    UPDATE {schema}.messages AS m
    SET state = 'paused'
    FROM disabled
    WHERE m.endpoint_id = disabled.id AND m.state = 'ready'
), done AS (
    -- One primary key lookup per outcome. The state is compared with a
    -- sub-select, not a constant, so that the planner cannot walk the partial
    -- lease index instead (every running row of every dispatcher, for each
    -- outcome), as it does when its statistics say that nothing runs.
    DELETE FROM {schema}.messages AS m
    USING outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running') AND o.state = 'succeeded'
    RETURNING m.*, o.status AS final_status
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts, final_status,
           created_at, now()
    FROM done
), updated AS (
    -- A webhook whose endpoint was deleted while it was in flight (the delete set
    -- its endpoint_id to NULL) is dead like the endpoint's waiting messages, never
    -- retried: it would go unsigned to the deleted endpoint's URL.
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN o.state = 'ready' AND m.endpoint_id IS NULL
                          AND starts_with(m.target, 'endpoint:') THEN 'dead'
                     WHEN o.state = 'ready' AND m.endpoint_id IN (SELECT id FROM disabled)
                     THEN 'paused' ELSE o.state END,
        attempts = CASE WHEN o.sent THEN m.attempts ELSE m.attempts - 1 END,
        available_at = CASE WHEN o.state = 'ready'
                            THEN now() + make_interval(secs => o.delay_s)
                            ELSE m.available_at END,
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN o.state = 'ready' AND m.endpoint_id IS NULL
                               AND starts_with(m.target, 'endpoint:') THEN 'endpoint deleted'
                          WHEN o.sent THEN o.error ELSE m.last_error END,
        last_status = CASE WHEN o.sent THEN o.status ELSE m.last_status END,
        completed_at = CASE WHEN o.state = 'dead'
                              OR (m.endpoint_id IS NULL AND starts_with(m.target, 'endpoint:'))
                            THEN now() END
    FROM outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running') AND o.state <> 'succeeded'  -- as in done
    RETURNING m.id
), applied AS (
    SELECT id FROM done
    UNION ALL
    SELECT id FROM updated
), freed AS (
    UPDATE {schema}.endpoint_slots
    SET message_id = NULL
    WHERE message_id IN (SELECT id FROM applied)
), recorded AS (
    INSERT INTO {schema}.attempts (
        message_id, attempt, owner, started_at, duration_ms, status, outcome,
        error_class, error, response_excerpt
    )
    SELECT o.id, o.attempt, %(owner)s, o.started_at, o.duration_ms, o.status, o.outcome,
           o.error_class, o.error, o.excerpt
    FROM outcome AS o
    JOIN applied USING (id)
    WHERE o.sent
)
SELECT id, NULL AS disabled_endpoint, NULL AS reason FROM applied
UNION ALL
SELECT NULL, id, disabled_reason FROM endpoint_update WHERE newly_disabled

-- name: complete_succeeded
-- "complete" for the common batch, every outcome a sent success: no retry to
-- schedule, no message to kill, no endpoint to disable. It writes what
-- "complete" writes for such a batch, fenced the same way, with the same result
-- rows, and costs about half as much to plan and less to run.
WITH done AS (
    DELETE FROM {schema}.messages AS m
    USING unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(attempts)s AS integer[]),
        CAST(%(statuses)s AS integer[]),
        CAST(%(outcomes)s AS text[]),
        CAST(%(error_classes)s AS text[]),
        CAST(%(errors)s AS text[]),
        CAST(%(started)s AS timestamptz[]),
        CAST(%(durations)s AS integer[]),
        CAST(%(excerpts)s AS text[])
    ) AS o(id, attempt, status, outcome, error_class, error, started_at, duration_ms, excerpt)
    -- one primary key lookup per outcome, as in "complete"
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running')
    RETURNING m.*, o.status AS final_status, o.outcome, o.error_class, o.error,
              o.started_at, o.duration_ms, o.excerpt
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts, final_status,
           created_at, now()
    FROM done
), recorded AS (
    INSERT INTO {schema}.attempts (
        message_id, attempt, owner, started_at, duration_ms, status, outcome,
        error_class, error, response_excerpt
    )
    SELECT id, attempts, %(owner)s, started_at, duration_ms, final_status, outcome,
           error_class, error, excerpt
    FROM done
), endpoint_update AS (
    -- A success clears its endpoint's failure streak; a disabled endpoint stays
    -- disabled. Skipped on a healthy endpoint, as in "complete".
    UPDATE {schema}.endpoints AS e
    SET failure_streak = 0,
        failing_since = NULL,
        last_success_at = now(),
        disabled_reason = CASE WHEN NOT e.enabled THEN e.disabled_reason END,
        disabled_at = CASE WHEN NOT e.enabled THEN e.disabled_at END,
        updated_at = now()
    WHERE e.id = ANY (CAST(%(endpoint_ids)s AS bigint[]))
      AND (NOT e.enabled OR e.failure_streak > 0
           OR e.last_success_at IS NULL OR e.last_success_at <= now() - interval '10 seconds')
    RETURNING e.id, e.enabled
), paused AS (
    -- the waiting messages of an endpoint disabled meanwhile, as in "complete"
    UPDATE {schema}.messages
    SET state = 'paused'
    WHERE endpoint_id = ANY (ARRAY(SELECT id FROM endpoint_update WHERE NOT enabled))
      AND state = 'ready'
), freed AS (
    UPDATE {schema}.endpoint_slots
    SET message_id = NULL
    WHERE message_id = ANY (ARRAY(SELECT id FROM done WHERE endpoint_id IS NOT NULL))
)
SELECT id, NULL AS disabled_endpoint, NULL AS reason FROM done

-- name: recorded_attempts
-- Which of these sent outcomes an earlier try of the same write recorded: the
-- dispatcher asks after a write whose answer was lost and whose retry matched
-- nothing. A lease the rescuer took over has an attempt row too, but with the
-- outcome 'lease_expired', which no sent outcome has.
SELECT a.message_id
FROM unnest(
    CAST(%(ids)s AS bigint[]),
    CAST(%(attempts)s AS integer[]),
    CAST(%(outcomes)s AS text[])
) AS o(id, attempt, outcome)
JOIN {schema}.attempts AS a ON a.message_id = o.id AND a.attempt = o.attempt
WHERE a.owner = %(owner)s AND a.outcome = o.outcome

-- name: rescue
-- Return messages whose lease expired (their dispatcher died, froze or lost the
-- database) to ready, or to dead when their attempts are spent. Walks the lease
-- index; SKIP LOCKED keeps concurrent rescuers and completions out of each
-- other's way. The lost attempt is recorded against the owner that held it.
-- A webhook whose endpoint was deleted meanwhile is dead, as in complete.
WITH expired AS (
    SELECT id, lease_owner, attempts,
           endpoint_id IS NULL AND starts_with(target, 'endpoint:') AS orphaned
    FROM {schema}.messages
    WHERE state = 'running' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN m.attempts >= m.max_attempts OR expired.orphaned THEN 'dead'
                     ELSE 'ready' END,
        available_at = now(),
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN expired.orphaned THEN 'endpoint deleted'
                          ELSE 'lease expired: the dispatcher stopped renewing it' END,
        last_status = NULL,
        completed_at = CASE WHEN m.attempts >= m.max_attempts OR expired.orphaned
                            THEN now() END
    FROM expired
    WHERE m.id = expired.id
    RETURNING m.id, m.state
), recorded AS (
    INSERT INTO {schema}.attempts (message_id, attempt, owner, started_at, outcome, error_class, error)
    SELECT expired.id, expired.attempts, expired.lease_owner, now(), 'lease_expired',
           'lease_expired', 'lease expired: the dispatcher stopped renewing it'
    FROM expired
    JOIN rescued USING (id)
    -- informational only: never let a stray row stop the rescue of the rest
    ON CONFLICT (message_id, attempt) DO NOTHING
), freed AS (
    -- slots of rescued messages, and any slot whose holder is no longer running
    UPDATE {schema}.endpoint_slots AS s
    SET message_id = NULL
    WHERE s.message_id IN (SELECT id FROM rescued)
       OR (s.message_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM {schema}.messages AS m
            WHERE m.id = s.message_id AND m.state = 'running'))
), trimmed AS (
    -- free slots above a lowered cap
    DELETE FROM {schema}.endpoint_slots AS s
    USING {schema}.endpoints AS e
    WHERE e.id = s.endpoint_id AND s.message_id IS NULL
      AND s.slot > COALESCE(e.max_concurrency, 0)
)
SELECT id, state FROM rescued

-- name: work_remaining
-- For --drain: is anything due now or in flight, and how much is scheduled later.
-- "Due" skips what claim skips: a ready webhook whose endpoint is disabled (one
-- committed after the disable paused the rest) waits, and must not keep a drain
-- from ever finishing.
SELECT
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND m.available_at <= now()
       AND (m.endpoint_id IS NULL OR EXISTS (
             SELECT 1 FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id AND e.enabled)))
        AS due,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'running') AS running,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'ready' AND available_at > now()) AS scheduled

-- name: publish
-- Fan one event out to every enabled endpoint subscribed to its type, in the
-- caller's transaction: one message per endpoint, keyed "<event key>:<endpoint>"
-- so that publishing the same event again writes nothing. A subscription is an
-- exact type or a "prefix.*" pattern; an endpoint with none gets every type.
-- Returns the new message ids, then (created = false) the ids that existed. A key
-- that a concurrent transaction committed while this statement waited for it is
-- not in this statement's snapshot: it comes back with a NULL id, and the caller
-- looks it up with publish_existing (as enqueue does with enqueue_existing).
WITH subscribed AS (
    SELECT e.id,
           'endpoint:' || e.id AS target,
           %(event_key)s || ':' || e.id AS idempotency_key
    FROM {schema}.endpoints AS e
    WHERE e.enabled
      AND (cardinality(e.event_types) = 0
           OR %(event_type)s = ANY (e.event_types)
           OR EXISTS (
                SELECT 1 FROM unnest(e.event_types) AS pattern
                WHERE right(pattern, 2) = '.*'
                  AND starts_with(%(event_type)s, left(pattern, -1))))
), new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    SELECT target, idempotency_key, nextval('{schema}.messages_id_seq')
    FROM subscribed
    ORDER BY id
    ON CONFLICT (target, idempotency_key) DO NOTHING
    RETURNING target, idempotency_key, message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts
    )
    SELECT k.message_id, k.idempotency_key, k.target, s.id, NULL, 'POST',
           CAST('{{}}' AS jsonb), CAST(%(body)s AS bytea), 'application/json',
           CAST(%(event_type)s AS text), CAST(%(ordering_key)s AS text), 'ready',
           CAST(%(max_attempts)s AS integer)
    FROM new_key AS k
    JOIN subscribed AS s USING (target)
    RETURNING id
)
SELECT id, true AS created, NULL AS target, NULL AS idempotency_key{notify}
FROM new_message
UNION ALL
SELECT k.message_id, false, s.target, s.idempotency_key{notify}
FROM subscribed AS s
LEFT JOIN {schema}.message_keys AS k USING (target, idempotency_key)
WHERE NOT EXISTS (
    SELECT 1 FROM new_key AS n
    WHERE n.target = s.target AND n.idempotency_key = s.idempotency_key)

-- name: publish_existing
-- Runs as a separate statement after publish met keys it could not see, so that
-- in READ COMMITTED it sees the rows the concurrent transaction committed.
SELECT k.message_id
FROM unnest(CAST(%(targets)s AS text[]), CAST(%(idempotency_keys)s AS text[]))
     AS wanted(target, idempotency_key)
JOIN {schema}.message_keys AS k USING (target, idempotency_key)

-- name: endpoint_insert
INSERT INTO {schema}.endpoints (url, description, event_types, secrets, metadata, max_concurrency)
VALUES (%(url)s, %(description)s, CAST(%(event_types)s AS text[]), CAST(%(secrets)s AS jsonb),
        CAST(%(metadata)s AS jsonb), %(max_concurrency)s)
RETURNING id

-- name: endpoint_slots_sync
-- Make an endpoint's slot rows match its max_concurrency: add the missing ones,
-- remove free ones above the cap (held ones go when they are freed).
WITH endpoint AS (
    SELECT id, COALESCE(max_concurrency, 0) AS cap
    FROM {schema}.endpoints
    WHERE id = %(id)s
), added AS (
    INSERT INTO {schema}.endpoint_slots (endpoint_id, slot)
    SELECT endpoint.id, g FROM endpoint, generate_series(1, endpoint.cap) AS g
    ON CONFLICT DO NOTHING
    RETURNING slot
), removed AS (
    DELETE FROM {schema}.endpoint_slots AS s
    USING endpoint
    WHERE s.endpoint_id = endpoint.id AND s.slot > endpoint.cap AND s.message_id IS NULL
    RETURNING slot
)
SELECT (SELECT count(*) FROM added), (SELECT count(*) FROM removed)

-- name: endpoint_get
SELECT id, url, description, event_types, secrets, metadata, enabled, disabled_reason,
       disabled_at, failure_streak, failing_since, last_success_at, max_concurrency,
       created_at, updated_at, now()
FROM {schema}.endpoints
WHERE id = %(id)s

-- name: endpoint_lock
SELECT id, url, description, event_types, secrets, metadata, enabled, disabled_reason,
       disabled_at, failure_streak, failing_since, last_success_at, max_concurrency,
       created_at, updated_at, now()
FROM {schema}.endpoints
WHERE id = %(id)s
FOR UPDATE

-- name: endpoint_list
SELECT id, url, description, event_types, secrets, metadata, enabled, disabled_reason,
       disabled_at, failure_streak, failing_since, last_success_at, max_concurrency,
       created_at, updated_at, now()
FROM {schema}.endpoints
ORDER BY id

-- name: endpoint_update
UPDATE {schema}.endpoints
SET url = %(url)s,
    description = %(description)s,
    event_types = CAST(%(event_types)s AS text[]),
    secrets = CAST(%(secrets)s AS jsonb),
    metadata = CAST(%(metadata)s AS jsonb),
    max_concurrency = %(max_concurrency)s,
    updated_at = now()
WHERE id = %(id)s
RETURNING id

-- name: endpoint_disable
-- Disable an endpoint and pause its waiting messages: they are neither attempted
-- nor dead, and resume when it is enabled again. Deliveries in flight finish;
-- a retry of theirs is paused by the completion batch.
WITH endpoint AS (
    UPDATE {schema}.endpoints
    SET enabled = false,
        disabled_reason = %(reason)s,
        disabled_at = now(),
        updated_at = now()
    WHERE id = %(id)s
    RETURNING id
), paused AS (
    UPDATE {schema}.messages AS m
    SET state = 'paused'
    FROM endpoint
    WHERE m.endpoint_id = endpoint.id AND m.state = 'ready'
    RETURNING m.id
)
SELECT (SELECT count(*) FROM endpoint), (SELECT count(*) FROM paused)

-- name: endpoint_enable
WITH endpoint AS (
    UPDATE {schema}.endpoints
    SET enabled = true,
        disabled_reason = NULL,
        disabled_at = NULL,
        failure_streak = 0,
        failing_since = NULL,
        updated_at = now()
    WHERE id = %(id)s
    RETURNING id
), resumed AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', available_at = now()
    FROM endpoint
    WHERE m.endpoint_id = endpoint.id AND m.state = 'paused'
    RETURNING m.id
)
SELECT (SELECT count(*) FROM endpoint), (SELECT count(*) FROM resumed){notify}

-- name: endpoint_detach
-- Before deleting an endpoint: its messages keep its URL (history stays
-- readable), and the ones still waiting become dead.
UPDATE {schema}.messages AS m
SET url = e.url,
    state = CASE WHEN m.state IN ('ready', 'paused') THEN 'dead' ELSE m.state END,
    last_error = CASE WHEN m.state IN ('ready', 'paused') THEN 'endpoint deleted'
                      ELSE m.last_error END,
    completed_at = CASE WHEN m.state IN ('ready', 'paused') THEN now() ELSE m.completed_at END
FROM {schema}.endpoints AS e
WHERE e.id = %(id)s AND m.endpoint_id = e.id
RETURNING m.id

-- name: endpoint_delete
DELETE FROM {schema}.endpoints WHERE id = %(id)s RETURNING id

-- name: dead_list
-- Dead messages for an operator, newest first: a backward scan of the dead
-- partial index (completed_at, id). A message of a deleted endpoint keeps its
-- endpoint id in its target ("endpoint:<id>"), so the endpoint filter matches
-- on the target and finds those too.
SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url),
       COALESCE(m.endpoint_id,
                CASE WHEN starts_with(m.target, 'endpoint:')
                     THEN CAST(substr(m.target, 10) AS bigint) END),
       m.event_type, m.attempts, m.max_attempts, m.last_status, m.last_error,
       m.created_at, m.completed_at
FROM {schema}.messages AS m
LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
WHERE m.state = 'dead'
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL
       OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
  AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
  AND (CAST(%(since)s AS timestamptz) IS NULL
       OR m.completed_at >= CAST(%(since)s AS timestamptz))
ORDER BY m.completed_at DESC, m.id DESC
LIMIT %(limit)s

-- name: dead_count
-- How many dead messages a retry or purge with the same selection would touch
-- (asked before an operator confirms a purge).
SELECT count(*)
FROM {schema}.messages AS m
WHERE m.state = 'dead'
  AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL
       OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
  AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
  AND (CAST(%(since)s AS timestamptz) IS NULL
       OR m.completed_at >= CAST(%(since)s AS timestamptz))

-- name: dead_retry
-- Redrive dead messages with a fresh attempt budget. attempts is kept: attempt
-- numbers are the fencing tokens of claims and part of the attempts table's key,
-- so they must never repeat; the budget is raised instead (max_attempts =
-- attempts + budget). The key, body and id stay, so the receiver sees the same
-- Idempotency-Key / webhook-id and dedupes a delivery that did land before.
-- A message of a disabled endpoint is paused (enabling the endpoint resumes it);
-- one whose endpoint was deleted stays dead: it would go out unsigned to a URL
-- nobody manages any more.
WITH chosen AS (
    SELECT m.id, e.enabled
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
    WHERE m.state = 'dead'
      AND (m.endpoint_id IS NOT NULL OR NOT starts_with(m.target, 'endpoint:'))
      AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
      AND (CAST(%(endpoint_id)s AS bigint) IS NULL
           OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
      AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
      AND (CAST(%(since)s AS timestamptz) IS NULL
           OR m.completed_at >= CAST(%(since)s AS timestamptz))
    ORDER BY m.id
    FOR UPDATE OF m
), retried AS (
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN chosen.enabled IS FALSE THEN 'paused' ELSE 'ready' END,
        max_attempts = m.attempts + CASE WHEN m.endpoint_id IS NULL
                                         THEN CAST(%(budget)s AS integer)
                                         ELSE CAST(%(webhook_budget)s AS integer) END,
        retry_base = m.attempts,
        available_at = now(),
        completed_at = NULL
    FROM chosen
    WHERE m.id = chosen.id AND m.state = 'dead'
    RETURNING m.id, m.state
)
SELECT (SELECT count(*) FROM retried),
       (SELECT count(*) FROM retried WHERE state = 'paused'){notify}

-- name: dead_purge
-- Delete dead messages and their attempt rows. Their message_keys rows stay:
-- the key remains used, so enqueuing it again returns the purged id and writes
-- nothing (the request may have had its effect before it was declared dead).
WITH chosen AS (
    SELECT m.id
    FROM {schema}.messages AS m
    WHERE m.state = 'dead'
      AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
      AND (CAST(%(endpoint_id)s AS bigint) IS NULL
           OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
      AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
      AND (CAST(%(since)s AS timestamptz) IS NULL
           OR m.completed_at >= CAST(%(since)s AS timestamptz))
    ORDER BY m.id
    FOR UPDATE
), purged AS (
    DELETE FROM {schema}.messages AS m
    USING chosen
    WHERE m.id = chosen.id AND m.state = 'dead'
    RETURNING m.id
), forgotten AS (
    DELETE FROM {schema}.attempts AS a
    USING purged
    WHERE a.message_id = purged.id
)
SELECT count(*) FROM purged

-- name: replay_endpoint
-- The endpoint a replay targets. FOR KEY SHARE keeps it from being deleted
-- until the replay commits, without blocking the dispatchers' health updates.
SELECT id, enabled, disabled_reason
FROM {schema}.endpoints
WHERE id = %(endpoint_id)s
FOR KEY SHARE

-- name: replay
-- Send delivered webhook messages again: move each history row back into the
-- hot table with its id, key and body (state ready), so the same webhook-id
-- goes out and receivers dedupe. attempts is kept (attempt numbers never
-- repeat); the budget is raised on top of it. Walks delivered_endpoint_idx.
WITH chosen AS (
    SELECT d.id
    FROM {schema}.delivered AS d
    WHERE d.endpoint_id = %(endpoint_id)s
      AND d.completed_at >= CAST(%(since)s AS timestamptz)
      AND (CAST(%(until)s AS timestamptz) IS NULL
           OR d.completed_at < CAST(%(until)s AS timestamptz))
    ORDER BY d.id
    FOR UPDATE
), moved AS (
    DELETE FROM {schema}.delivered AS d
    USING chosen
    WHERE d.id = chosen.id
    RETURNING d.*
), replayed AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, attempts, max_attempts,
        retry_base, available_at, last_status, created_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, 'ready', attempts,
           attempts + CAST(%(budget)s AS integer), attempts, now(), last_status, created_at
    FROM moved
    RETURNING id
)
SELECT count(*){notify} FROM replayed

-- name: message_get
-- One message, from the hot table or (state 'succeeded') from the history.
SELECT m.id, m.idempotency_key, m.target,
       COALESCE(m.endpoint_id,
                CASE WHEN starts_with(m.target, 'endpoint:')
                     THEN CAST(substr(m.target, 10) AS bigint) END),
       COALESCE(m.url, e.url), m.method, m.headers, m.body, m.content_type,
       m.event_type, m.ordering_key, m.state, m.attempts, m.max_attempts,
       m.available_at, m.lease_owner, m.lease_until, m.last_status, m.last_error,
       m.created_at, m.completed_at
FROM {schema}.messages AS m
LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
WHERE m.id = %(id)s
UNION ALL
SELECT d.id, d.idempotency_key, d.target, d.endpoint_id, COALESCE(d.url, e.url),
       d.method, d.headers, d.body, d.content_type, d.event_type, d.ordering_key,
       'succeeded', d.attempts, d.max_attempts, NULL, NULL, NULL, d.last_status, NULL,
       d.created_at, d.completed_at
FROM {schema}.delivered AS d
LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
WHERE d.id = %(id)s

-- name: message_attempts
SELECT attempt, owner, started_at, duration_ms, status, outcome, error_class, error,
       response_excerpt
FROM {schema}.attempts
WHERE message_id = %(id)s
ORDER BY attempt

-- name: status_counts
-- The backlog by state, lease health, lag and recent throughput. Ready and
-- running counts walk their partial indexes; lag is how long the oldest due
-- message has waited since it became due (not since it was created, so a
-- scheduled or retried message does not look late).
SELECT
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'ready' AND available_at <= now()),
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'ready' AND available_at > now()),
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'running' AND lease_until >= now()),
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'running' AND lease_until < now()),
    (SELECT count(*) FROM {schema}.messages WHERE state = 'paused'),
    (SELECT count(*) FROM {schema}.messages WHERE state = 'dead'),
    (SELECT CAST(EXTRACT(epoch FROM now() - min(available_at)) AS double precision)
     FROM {schema}.messages
     WHERE state = 'ready' AND available_at <= now()),
    (SELECT count(*) FROM {schema}.attempts
     WHERE started_at >= now() - interval '5 minutes' AND outcome = 'succeeded'),
    (SELECT count(*) FROM {schema}.attempts
     WHERE started_at >= now() - interval '5 minutes' AND outcome <> 'succeeded'),
    now()

-- name: status_endpoints
-- Per endpoint: health, and its messages still to deliver (ready, running,
-- paused) and dead.
SELECT e.id, e.url, e.enabled, e.disabled_reason, e.failure_streak, e.last_success_at,
       count(m.id) FILTER (WHERE m.state IN ('ready', 'running', 'paused')),
       count(m.id) FILTER (WHERE m.state = 'dead')
FROM {schema}.endpoints AS e
LEFT JOIN {schema}.messages AS m ON m.endpoint_id = e.id
GROUP BY e.id
ORDER BY e.id

-- name: retention
-- Remove one bounded batch of history: delivered messages completed before the
-- retention period, with their attempt rows and idempotency keys (so the dedupe
-- window of a key is the retention period). Dead messages are kept until purged.
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
)
SELECT count(*) FROM removed
