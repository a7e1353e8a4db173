-- Event types' settings, written by operators (outbox.event_types): the retry
-- schedule of the webhooks of one event type whose endpoint has none of its own.
-- A claim reads it (fragment "retry_schedule" of the dispatcher's claim.sql, in
-- dispatchers/store/sql). Placeholders as in enqueue.sql.

-- fragment: event_type_rows
SELECT event_type, CAST(retry_schedule AS double precision[]) AS retry_schedule,
       created_at, updated_at
FROM {schema}.event_types

-- name: event_type_set
-- Create or replace an event type's settings.
INSERT INTO {schema}.event_types AS t (event_type, retry_schedule)
VALUES (%(event_type)s, CAST(%(retry_schedule)s AS double precision[]))
ON CONFLICT (event_type) DO UPDATE
SET retry_schedule = excluded.retry_schedule, updated_at = now()
RETURNING t.event_type, CAST(t.retry_schedule AS double precision[]) AS retry_schedule,
          t.created_at, t.updated_at

-- name: event_type_get
{event_type_rows}
WHERE event_type = %(event_type)s

-- name: event_type_list
{event_type_rows}
ORDER BY event_type

-- name: event_type_delete
DELETE FROM {schema}.event_types
WHERE event_type = %(event_type)s
RETURNING event_type
