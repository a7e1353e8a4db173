-- Messages as the web surfaces show them: searches of the queue and the
-- history, a tenant's latest deliveries, one message, the dead letters.
-- %(tenant_id)s scopes every statement: NULL is the operator (every message);
-- a tenant's row id keeps to the messages of that tenant's endpoints. A
-- message without an endpoint, or whose endpoint was deleted, is the operator's.

-- fragment: tenant_endpoints
-- The ids of the endpoints of tenant %(tenant_id)s, as an array made once per
-- statement (endpoints_tenant_idx): a tenant's messages are those of these
-- endpoints, which the endpoint indexes of the queue and the history can probe.
ARRAY(SELECT te.id FROM {schema}.endpoints AS te
      WHERE te.tenant_id = CAST(%(tenant_id)s AS bigint))

-- fragment: of_tenant
-- Whether message m is in the scope of %(tenant_id)s (always, without one).
(CAST(%(tenant_id)s AS bigint) IS NULL
 OR EXISTS (SELECT 1 FROM {schema}.endpoints AS te
            WHERE te.id = m.endpoint_id AND te.tenant_id = CAST(%(tenant_id)s AS bigint)))

-- fragment: messages_found
-- The queue's side of a search: a message summary (held: a ready message whose
-- destination an open breaker or a Retry-After hold blocks, as the claim reads
-- destination_health) and every filter but the page's bound, which the
-- includer adds (web_messages: older than %(before)s; web_messages_newer:
-- newer than %(after)s), with its order and scan limit. A filter left NULL
-- matches every message; %(untenanted)s keeps to those of no tenant: enqueued
-- to a URL, or of an endpoint of none.
(SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url) AS url, m.endpoint_id,
        t.external_id AS tenant, m.event_type, CAST(m.state AS text) AS state, m.attempts,
        m.last_status, left(m.last_error, 300) AS last_error, m.created_at, m.completed_at,
        m.state = 'ready' AND EXISTS (
            SELECT 1 FROM {schema}.destination_health AS dh
            WHERE dh.destination = m.destination
              AND (dh.blocked_until > now() OR dh.state <> 'held')) AS held
 FROM (SELECT *
       FROM {schema}.messages AS m
       WHERE (CAST(%(key)s AS text) IS NULL OR m.idempotency_key = CAST(%(key)s AS text))
         AND (CAST(%(event_type)s AS text) IS NULL
              OR m.event_type = CAST(%(event_type)s AS text))
         AND (CAST(%(endpoint_id)s AS bigint) IS NULL
              OR m.endpoint_id = CAST(%(endpoint_id)s AS bigint))
         AND (CAST(%(state)s AS text) IS NULL OR m.state = CAST(%(state)s AS text))
         AND (CAST(%(created_from)s AS timestamptz) IS NULL
              OR m.created_at >= CAST(%(created_from)s AS timestamptz))
         AND (CAST(%(created_until)s AS timestamptz) IS NULL
              OR m.created_at < CAST(%(created_until)s AS timestamptz))
         AND (CAST(%(tenant_id)s AS bigint) IS NULL OR m.endpoint_id = ANY ({tenant_endpoints}))
         AND (NOT CAST(%(untenanted)s AS boolean)
              OR (m.endpoint_id IS NULL AND NOT starts_with(m.target, 'endpoint:'))
              OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                         WHERE e.id = m.endpoint_id AND e.tenant_id IS NULL))

-- fragment: delivered_found
-- The history's side of a search, as messages_found is the queue's.
(SELECT d.id, d.idempotency_key, COALESCE(d.url, e.url), d.endpoint_id, t.external_id,
        d.event_type, 'delivered', d.attempts, d.last_status, NULL, d.created_at,
        d.completed_at, false
 FROM (SELECT *
       FROM {schema}.delivered AS d
       WHERE (CAST(%(state)s AS text) IS NULL OR CAST(%(state)s AS text) = 'delivered')
         AND (CAST(%(key)s AS text) IS NULL OR d.idempotency_key = CAST(%(key)s AS text))
         AND (CAST(%(event_type)s AS text) IS NULL
              OR d.event_type = CAST(%(event_type)s AS text))
         AND (CAST(%(endpoint_id)s AS bigint) IS NULL
              OR d.endpoint_id = CAST(%(endpoint_id)s AS bigint))
         AND (CAST(%(created_from)s AS timestamptz) IS NULL
              OR (d.created_at >= CAST(%(created_from)s AS timestamptz)
                  AND d.completed_at >= CAST(%(created_from)s AS timestamptz)))
         AND (CAST(%(created_until)s AS timestamptz) IS NULL
              OR d.created_at < CAST(%(created_until)s AS timestamptz))
         AND (CAST(%(tenant_id)s AS bigint) IS NULL OR d.endpoint_id = ANY ({tenant_endpoints}))
         AND (NOT CAST(%(untenanted)s AS boolean)
              OR (d.endpoint_id IS NULL AND NOT starts_with(d.target, 'endpoint:'))
              OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                         WHERE e.id = d.endpoint_id AND e.tenant_id IS NULL))

-- name: web_messages
-- Messages matching a search, newest first, older than id %(before)s when it
-- is given (keyset paging: a range scan of each primary key, as cheap far back
-- as at the start), from the hot table and the history: each side is cut at
-- the limit before the two are merged; the state 'delivered' names the
-- history. A message completes after it is created, so "created since" also
-- bounds the history's completion time (delivered_completed_idx). %(body)s,
-- when given, is looked for in the bodies of the newest %(scan)s messages of
-- each side that match the other filters, never more (%(scan)s is %(limit)s
-- without it).
{messages_found}
         AND (CAST(%(before)s AS bigint) IS NULL OR m.id < CAST(%(before)s AS bigint))
       ORDER BY m.id DESC
       LIMIT %(scan)s) AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN m.body) > 0
 ORDER BY m.id DESC
 LIMIT %(limit)s)
UNION ALL
{delivered_found}
         AND (CAST(%(before)s AS bigint) IS NULL OR d.id < CAST(%(before)s AS bigint))
       ORDER BY d.id DESC
       LIMIT %(scan)s) AS d
 LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN d.body) > 0
 ORDER BY d.id DESC
 LIMIT %(limit)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: web_messages_newer
-- web_messages the other way: the messages just newer than id %(after)s,
-- oldest first (the caller shows them newest first).
{messages_found}
         AND (CAST(%(after)s AS bigint) IS NULL OR m.id > CAST(%(after)s AS bigint))
       ORDER BY m.id ASC
       LIMIT %(scan)s) AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN m.body) > 0
 ORDER BY m.id ASC
 LIMIT %(limit)s)
UNION ALL
{delivered_found}
         AND (CAST(%(after)s AS bigint) IS NULL OR d.id > CAST(%(after)s AS bigint))
       ORDER BY d.id ASC
       LIMIT %(scan)s) AS d
 LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN d.body) > 0
 ORDER BY d.id ASC
 LIMIT %(limit)s)
ORDER BY id ASC
LIMIT %(limit)s

-- name: web_deliveries
-- The newest messages in scope, waiting or done, of one endpoint or of all:
-- per endpoint (endpoints_tenant_idx), the newest %(limit)s of the queue
-- (messages_endpoint_idx; an endpoint's queue is its backlog) and the
-- %(limit)s last completed of the history (delivered_endpoint_idx, newest
-- first), then the newest %(limit)s of them all by creation.
SELECT f.*
FROM {schema}.endpoints AS e
LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
CROSS JOIN LATERAL (
    (SELECT m.id, m.idempotency_key, e.url, m.endpoint_id, t.external_id AS tenant,
            m.event_type, CAST(m.state AS text) AS state, m.attempts, m.last_status,
            left(m.last_error, 300) AS last_error, m.created_at, m.completed_at,
            m.state = 'ready' AND EXISTS (
                SELECT 1 FROM {schema}.destination_health AS dh
                WHERE dh.destination = m.destination
                  AND (dh.blocked_until > now() OR dh.state <> 'held')) AS held
     FROM {schema}.messages AS m
     WHERE m.endpoint_id = e.id
     ORDER BY m.id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT d.id, d.idempotency_key, e.url, d.endpoint_id, t.external_id, d.event_type,
            'delivered', d.attempts, d.last_status, NULL, d.created_at, d.completed_at, false
     FROM {schema}.delivered AS d
     WHERE d.endpoint_id = e.id
     ORDER BY d.completed_at DESC
     LIMIT %(limit)s)
) AS f
WHERE (CAST(%(tenant_id)s AS bigint) IS NULL OR e.tenant_id = CAST(%(tenant_id)s AS bigint))
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL OR e.id = CAST(%(endpoint_id)s AS bigint))
ORDER BY f.created_at DESC, f.id DESC
LIMIT %(limit)s

-- fragment: message_rows
-- One message in scope, in the queue or in the history, by its primary key;
-- its URL its endpoint's, if it has one, and the names of its headers (not
-- their values). A waiting message of a deleted endpoint keeps its endpoint id
-- in its target (as the library's message_show reads it), but is no tenant's.
(SELECT m.id, m.idempotency_key,
        COALESCE(m.endpoint_id,
                 CASE WHEN starts_with(m.target, 'endpoint:')
                      THEN CAST(substr(m.target, 10) AS bigint) END) AS endpoint_id,
        COALESCE(e.url, m.url) AS url, m.method,
        ARRAY(SELECT jsonb_object_keys(m.headers)) AS header_names, m.content_type,
        m.event_type, m.ordering_key, CAST(m.state AS text) AS state, m.attempts,
        m.max_attempts, m.available_at, m.last_status, m.last_error, m.created_at,
        m.completed_at, m.body
 FROM {schema}.messages AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
 WHERE m.id = %(id)s
   AND (CAST(%(tenant_id)s AS bigint) IS NULL OR e.tenant_id = CAST(%(tenant_id)s AS bigint)))
UNION ALL
(SELECT d.id, d.idempotency_key, d.endpoint_id, COALESCE(e.url, d.url), d.method,
        ARRAY(SELECT jsonb_object_keys(d.headers)), d.content_type, d.event_type,
        d.ordering_key, 'delivered', d.attempts, d.max_attempts, NULL, d.last_status, NULL,
        d.created_at, d.completed_at, d.body
 FROM {schema}.delivered AS d
 LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
 WHERE d.id = %(id)s
   AND (CAST(%(tenant_id)s AS bigint) IS NULL OR e.tenant_id = CAST(%(tenant_id)s AS bigint)))

-- name: web_message
-- One message in scope with its body; no row for an id that is missing or
-- another's.
{message_rows}
LIMIT 1

-- name: web_message_visible
-- Whether message %(id)s (waiting, dead or delivered) is in scope.
SELECT EXISTS (SELECT 1 FROM {schema}.messages AS m WHERE m.id = %(id)s AND {of_tenant})
    OR EXISTS (SELECT 1 FROM {schema}.delivered AS m WHERE m.id = %(id)s AND {of_tenant})
    AS visible

-- name: web_dead_page
-- Dead messages in scope matching every filter given, newest first (by id),
-- before id %(before)s. A message of a deleted endpoint keeps its endpoint id
-- in its target (as the library's dead_list reads it), but belongs to no tenant.
-- %(untenanted)s keeps to those of no tenant: enqueued to a URL, or of an
-- endpoint of none (a message of a deleted endpoint is neither).
SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url) AS url,
       COALESCE(m.endpoint_id,
                CASE WHEN starts_with(m.target, 'endpoint:')
                     THEN CAST(substr(m.target, 10) AS bigint) END) AS endpoint_id,
       m.event_type, m.attempts, m.max_attempts, m.last_status, m.last_error,
       m.created_at, m.completed_at
FROM {schema}.messages AS m
LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
WHERE m.state = 'dead' AND m.id < %(before)s
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL
       OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
  AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
  AND (CAST(%(since)s AS timestamptz) IS NULL
       OR m.completed_at >= CAST(%(since)s AS timestamptz))
  AND (NOT CAST(%(untenanted)s AS boolean)
       OR (m.endpoint_id IS NULL AND NOT starts_with(m.target, 'endpoint:'))
       OR EXISTS (SELECT 1 FROM {schema}.endpoints AS ue
                  WHERE ue.id = m.endpoint_id AND ue.tenant_id IS NULL))
  AND {of_tenant}
ORDER BY m.id DESC
LIMIT %(limit)s

-- name: web_dead_ids
-- The ids of the dead messages in scope of a selection (ids, filters, or all),
-- at most %(limit)s, for the library's retry and purge.
SELECT m.id
FROM {schema}.messages AS m
WHERE m.state = 'dead'
  AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL
       OR m.endpoint_id = CAST(%(endpoint_id)s AS bigint))
  AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
  AND (CAST(%(since)s AS timestamptz) IS NULL
       OR m.completed_at >= CAST(%(since)s AS timestamptz))
  AND {of_tenant}
ORDER BY m.id
LIMIT %(limit)s
