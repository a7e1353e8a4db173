-- What the consumer portal reads (dispatchers.portal): one tenant's endpoints,
-- messages and attempts. Every statement takes the tenant's key as
-- %(tenant_id)s and reads only what belongs to it: an endpoint whose tenant_id
-- it is, and a message or attempt through its endpoint. A row of another
-- tenant is never read, so a page cannot show it whatever its code does; a
-- guessed id of another tenant finds nothing, as a missing one does.

-- fragment: consumer_endpoint_columns
-- An endpoint as the portal shows it: its settings, state and health, its
-- signing secrets in force as stored (the portal opens them only to show their
-- fingerprints, or the secret itself when asked), and its messages pending and
-- dead (messages_endpoint_idx).
SELECT e.id, e.url, e.description, e.event_types, e.enabled,
       left(e.disabled_reason, 300) AS disabled_reason, e.failure_streak,
       e.failing_since, e.last_success_at, e.created_at,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                            'secret', s.secret, 'key_id', s.key_id,
                            'expires_at', s.expires_at)
                        ORDER BY s.id DESC)
                 FROM {schema}.endpoint_secrets AS s
                 WHERE s.endpoint_id = e.id
                   AND (s.expires_at IS NULL OR s.expires_at > now())), '[]') AS secrets,
       c.pending, c.dead
FROM {schema}.endpoints AS e
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE m.state IN ('ready', 'running', 'paused')) AS pending,
           count(*) FILTER (WHERE m.state = 'dead') AS dead
    FROM {schema}.messages AS m
    WHERE m.endpoint_id = e.id
) AS c

-- name: consumer_endpoints
-- The tenant's endpoints by id, at most %(limit)s (endpoints_tenant_idx).
{consumer_endpoint_columns}
WHERE e.tenant_id = %(tenant_id)s
ORDER BY e.id
LIMIT %(limit)s

-- name: consumer_endpoint
-- One endpoint of the tenant; no row for an id that is missing or another's.
{consumer_endpoint_columns}
WHERE e.id = %(id)s AND e.tenant_id = %(tenant_id)s

-- name: consumer_endpoint_owned
-- Whether the endpoint is the tenant's (before the library changes it): its
-- id, or no row. An endpoint's tenant is fixed when it is created.
SELECT e.id FROM {schema}.endpoints AS e
WHERE e.id = %(id)s AND e.tenant_id = %(tenant_id)s

-- name: consumer_deliveries
-- The tenant's newest messages, waiting or done, of one endpoint or of all its
-- endpoints: per endpoint (endpoints_tenant_idx), the newest %(limit)s of the
-- queue (messages_endpoint_idx; an endpoint's queue is its backlog) and the
-- %(limit)s last completed of the history (delivered_endpoint_idx, newest
-- first), then the newest %(limit)s of them all by creation.
SELECT f.*
FROM {schema}.endpoints AS e
CROSS JOIN LATERAL (
    (SELECT m.id, m.endpoint_id, e.url, m.event_type, CAST(m.state AS text) AS state,
            m.attempts, m.last_status, left(m.last_error, 300) AS last_error,
            m.created_at, m.completed_at
     FROM {schema}.messages AS m
     WHERE m.endpoint_id = e.id
     ORDER BY m.id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT d.id, d.endpoint_id, e.url, d.event_type, 'delivered', d.attempts,
            d.last_status, NULL, d.created_at, d.completed_at
     FROM {schema}.delivered AS d
     WHERE d.endpoint_id = e.id
     ORDER BY d.completed_at DESC
     LIMIT %(limit)s)
) AS f
WHERE e.tenant_id = %(tenant_id)s
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL OR e.id = CAST(%(endpoint_id)s AS bigint))
ORDER BY f.created_at DESC, f.id DESC
LIMIT %(limit)s

-- fragment: consumer_message_rows
-- One message of the tenant, in the queue or in the history, by its primary
-- key, joined to its endpoint of the tenant: no row for another's.
(SELECT m.id, m.idempotency_key, m.endpoint_id, e.url, m.event_type,
        CAST(m.state AS text) AS state, m.attempts, m.max_attempts, m.available_at,
        m.last_status, m.last_error, m.created_at, m.completed_at, m.body
 FROM {schema}.messages AS m
 JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id AND e.tenant_id = %(tenant_id)s
 WHERE m.id = %(id)s)
UNION ALL
(SELECT d.id, d.idempotency_key, d.endpoint_id, e.url, d.event_type, 'delivered',
        d.attempts, d.max_attempts, NULL, d.last_status, NULL, d.created_at,
        d.completed_at, d.body
 FROM {schema}.delivered AS d
 JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id AND e.tenant_id = %(tenant_id)s
 WHERE d.id = %(id)s)

-- name: consumer_message
-- One message of the tenant with its body; no row for an id that is missing
-- or another's.
{consumer_message_rows}
LIMIT 1

-- name: consumer_attempts
-- The attempts of one message of the tenant, in order (the attempts' primary
-- key); none for another's. The dispatcher that made each is not shown.
SELECT a.attempt, a.started_at, a.duration_ms, a.status, a.outcome, a.error_class,
       left(a.error, 300) AS error, left(a.response_excerpt, 300) AS response_excerpt
FROM {schema}.attempts AS a
WHERE a.message_id = %(id)s
  AND EXISTS (SELECT 1 FROM ({consumer_message_rows}) AS owned)
ORDER BY a.attempt

-- name: consumer_sealed_secrets
-- Whether any signing secret is sealed: then a secret made without a key would
-- be the one stored in plain text (as ui_sealed_secrets asks).
SELECT EXISTS (SELECT 1 FROM {schema}.endpoint_secrets WHERE key_id IS NOT NULL) AS sealed
