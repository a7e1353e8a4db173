-- The benchmark's own statements, by name (loaded by dispatchers.bench.env).
--
-- "{schema}" is replaced by the quoted schema identifier. None of these run in a
-- dispatcher: they seed data, play the business application, set up and inspect
-- the benchmark's schemas, or are the baselines (naive, pgqueuer) that
-- `outbox bench --baseline` compares the dispatcher with.

-- name: seed_history
-- A delivered history of %(rows)s messages to one target, as the dispatcher would
-- have left it: the key (message_keys), the history row (delivered) and its one
-- attempt (attempts), spread over the past %(rows)s seconds. Ids come from the
-- messages sequence, so they never meet the ids of messages enqueued later.
WITH new_keys AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id, created_at)
    SELECT CAST(%(target)s AS text), 'history-' || g, nextval('{schema}.messages_id_seq'),
           now() - make_interval(secs => %(rows)s - g)
    FROM generate_series(1, CAST(%(rows)s AS integer)) AS g
    RETURNING target, idempotency_key, message_id, created_at
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT message_id, idempotency_key, target, NULL, target, 'POST', CAST('{{}}' AS jsonb),
           CAST(%(body)s AS bytea), 'application/json', NULL, NULL, 1, 12, 200,
           created_at, created_at + interval '20 milliseconds'
    FROM new_keys
)
INSERT INTO {schema}.attempts (message_id, attempt, owner, started_at, duration_ms, status, outcome)
SELECT message_id, 1, 'history', created_at + interval '10 milliseconds', 5, 200, 'delivered'
FROM new_keys

-- name: business_table
-- The application's own table, for the commit-throughput comparison.
CREATE TABLE {schema}.bench_orders (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id   bigint      NOT NULL,
    amount_cents  integer     NOT NULL,
    status        text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
)

-- name: business_insert
INSERT INTO {schema}.bench_orders (customer_id, amount_cents, status)
VALUES (%(customer_id)s, %(amount_cents)s, 'paid')

-- name: floor_table
-- The least any durable outbox writes per business transaction: one row of the
-- message's payload, keyed by a bigint identity (the enqueue scenario's floor).
CREATE TABLE {schema}.bench_floor (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload  bytea  NOT NULL
)

-- name: floor_insert
INSERT INTO {schema}.bench_floor (payload) VALUES (%(payload)s)

-- name: naive_claim
-- NAIVE BASELINE (comparison only). Claim ONE due message, in its own transaction,
-- the first in the claimable index (by destination, then due time).
UPDATE {schema}.messages AS m
SET state = 'running',
    lease_owner = %(owner)s,
    lease_until = now() + interval '30 seconds',
    attempts = m.attempts + 1
WHERE m.id = (
    SELECT id
    FROM {schema}.messages
    WHERE state = 'ready' AND available_at <= now()
    ORDER BY destination, available_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING m.id, m.idempotency_key, m.url, m.method, m.body, m.content_type, m.attempts

-- name: naive_complete
-- NAIVE BASELINE (comparison only). Record ONE success: move the row to the history
-- with its attempt row, matching the id alone (no owner or attempt fence, which
-- the dispatcher has and this design lacks).
WITH done AS (
    DELETE FROM {schema}.messages
    WHERE id = %(id)s
    RETURNING *
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts,
           CAST(%(status)s AS integer), created_at, now()
    FROM done
)
INSERT INTO {schema}.attempts (message_id, attempt, owner, started_at, duration_ms, status, outcome)
SELECT id, attempts, %(owner)s, %(started_at)s, %(duration_ms)s, %(status)s, 'delivered'
FROM done

-- name: naive_retry
-- NAIVE BASELINE (comparison only). Put ONE failed message back, by id alone.
UPDATE {schema}.messages
SET state = 'ready', lease_owner = NULL, lease_until = NULL,
    available_at = now() + interval '5 seconds',
    last_status = %(status)s, last_error = %(error)s
WHERE id = %(id)s

-- name: statement_timeout
-- Bounds every statement of the benchmark's own connections (seeding is slow).
SELECT set_config('statement_timeout', %(timeout)s, false)

-- name: drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE

-- name: row_counts
-- Where a drain left its messages: still queued, or moved to the history.
SELECT (SELECT count(*) FROM {schema}.messages) AS messages,
       (SELECT count(*) FROM {schema}.delivered) AS delivered

-- name: hot_table_sizes
-- The claimable table's size on disk (with its TOAST table and indexes) and its
-- indexes' alone: under a steady load both should stay flat, since delivered rows
-- leave the table and vacuum lets their space be reused.
SELECT pg_total_relation_size(c.oid) AS total_bytes,
       pg_indexes_size(c.oid) AS index_bytes
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'messages'

-- name: soak_states
-- Where the soak's messages that never reached the receiver are: still queued
-- (ready or running: being retried) or dead. A key in neither was lost.
SELECT state, count(*) AS count
FROM {schema}.messages
WHERE idempotency_key = ANY(%(keys)s)
GROUP BY state

-- name: sessions_named
-- How many sessions a process has open, by the application name it was given
-- (PGAPPNAME): the soak waits for a restarted dispatcher's before stopping it.
SELECT count(*) FROM pg_stat_activity WHERE application_name = %(name)s

-- name: analyze_messages
-- Fresh planner statistics for a seeded backlog, as production would have.
ANALYZE {schema}.messages

-- name: analyze_outbox
ANALYZE {schema}.messages, {schema}.message_keys, {schema}.delivered, {schema}.attempts

-- name: pgqueuer_analyze
-- PGQUEUER BASELINE (comparison only), in the schema pgqueuer was installed into.
ANALYZE {schema}.pgqueuer

-- name: pgqueuer_counts
-- PGQUEUER BASELINE (comparison only): jobs left in the queue table, and jobs
-- logged as successful.
SELECT (SELECT count(*) FROM {schema}.pgqueuer) AS queued,
       (SELECT count(*) FROM {schema}.pgqueuer_log WHERE status = 'successful') AS logged
