-- What an application runs inside its own transaction: enqueue and publish.
--
-- Loaded by outbox._queries: "{schema}" becomes the quoted schema identifier and
-- "{notify}" is empty in a statement and the wake-up call in its "_notify" twin;
-- parameters use psycopg's %(name)s style (translated for SQLAlchemy's text()).

-- name: enqueue
-- Insert the key first: if (target, key) exists already, the key insert does
-- nothing, so the message insert (which selects from it) does nothing too, and
-- the caller looks the existing id up with enqueue_existing. A concurrent
-- transaction holding the same key makes this statement wait for its outcome.
-- {notify} is either empty or a pg_notify call with a constant payload (so that
-- PostgreSQL folds all notifications of one transaction into one), made only
-- when a dispatcher is waiting for it (outbox._queries.Queries explains how).
WITH new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    VALUES (%(target)s, %(idempotency_key)s, nextval('{schema}.messages_id_seq'))
    ON CONFLICT (target, idempotency_key) DO NOTHING
    RETURNING message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts, available_at
    )
    SELECT new_key.message_id,
           CAST(%(idempotency_key)s AS text), CAST(%(target)s AS text),
           CAST(%(destination)s AS text),
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

-- name: publish
-- Fan one event out to every enabled endpoint subscribed to its type, in the
-- caller's transaction: one message per endpoint, keyed "<event key>:<endpoint>"
-- so that publishing the same event again writes nothing. The endpoint is the
-- message's destination ("endpoint:<id>", its target). A subscription is an
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
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts
    )
    SELECT k.message_id, k.idempotency_key, k.target, k.target, s.id, NULL, 'POST',
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
