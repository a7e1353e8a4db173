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
