-- Webhook endpoints: create, read, change, disable, enable, delete
-- (outbox.endpoints). Placeholders as in enqueue.sql.

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
SELECT (SELECT count(*) FROM endpoint) AS found, (SELECT count(*) FROM paused) AS moved

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
SELECT (SELECT count(*) FROM endpoint) AS found,
       (SELECT count(*) FROM resumed) AS moved{notify}

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
