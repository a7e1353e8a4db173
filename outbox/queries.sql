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
-- {notify} is either empty or a pg_notify call with a constant payload, so that
-- PostgreSQL folds all notifications of one transaction into one.
WITH new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    VALUES (%(target)s, %(idempotency_key)s, nextval('{schema}.messages_id_seq'))
    ON CONFLICT DO NOTHING
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
WITH candidates AS (
    SELECT m.id
    FROM {schema}.messages AS m
    WHERE m.state = 'ready'
      AND m.available_at <= now()
      AND (m.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1
            FROM {schema}.messages AS earlier
            WHERE earlier.ordering_key = m.ordering_key
              AND earlier.id < m.id
              AND earlier.state IN ('ready', 'running', 'paused')))
    ORDER BY m.available_at, m.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.messages AS m
SET state = 'running',
    lease_owner = %(owner)s,
    lease_until = now() + make_interval(secs => %(lease_s)s),
    attempts = m.attempts + 1
FROM candidates
WHERE m.id = candidates.id
RETURNING m.id, m.idempotency_key,
          COALESCE(m.url, (SELECT e.url FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id)),
          m.method, m.headers, m.body, m.content_type, m.attempts, m.max_attempts,
          m.endpoint_id, m.event_type, m.created_at

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
    ) AS o(id, attempt, state, delay_s, sent, status, outcome, error_class, error,
           started_at, duration_ms, excerpt)
), done AS (
    DELETE FROM {schema}.messages AS m
    USING outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = 'running' AND o.state = 'succeeded'
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
    UPDATE {schema}.messages AS m
    SET state = o.state,
        attempts = CASE WHEN o.sent THEN m.attempts ELSE m.attempts - 1 END,
        available_at = CASE WHEN o.state = 'ready'
                            THEN now() + make_interval(secs => o.delay_s)
                            ELSE m.available_at END,
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN o.sent THEN o.error ELSE m.last_error END,
        last_status = CASE WHEN o.sent THEN o.status ELSE m.last_status END,
        completed_at = CASE WHEN o.state = 'dead' THEN now() END
    FROM outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = 'running' AND o.state <> 'succeeded'
    RETURNING m.id
), applied AS (
    SELECT id FROM done
    UNION ALL
    SELECT id FROM updated
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
SELECT id FROM applied

-- name: rescue
-- Return messages whose lease expired (their dispatcher died, froze or lost the
-- database) to ready, or to dead when their attempts are spent. Walks the lease
-- index; SKIP LOCKED keeps concurrent rescuers and completions out of each
-- other's way. The lost attempt is recorded against the owner that held it.
WITH expired AS (
    SELECT id, lease_owner, attempts
    FROM {schema}.messages
    WHERE state = 'running' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN m.attempts >= m.max_attempts THEN 'dead' ELSE 'ready' END,
        available_at = now(),
        lease_owner = NULL,
        lease_until = NULL,
        last_error = 'lease expired: the dispatcher stopped renewing it',
        last_status = NULL,
        completed_at = CASE WHEN m.attempts >= m.max_attempts THEN now() END
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
)
SELECT id, state FROM rescued

-- name: work_remaining
-- For --drain: is anything due now or in flight, and how much is scheduled later.
SELECT
    (SELECT count(*) FROM {schema}.messages WHERE state = 'ready' AND available_at <= now()) AS due,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'running') AS running,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'ready' AND available_at > now()) AS scheduled
