-- What the management API reads and writes itself (dispatchers.api), beside the
-- library's statements, which its handlers call for every change they make.
-- Lists are pages: keyset by id (a range scan of a primary key, as cheap far
-- back as at the start), at most %(limit)s rows. %(tenant_id)s, when given,
-- keeps to the rows of that tenant's endpoints: a tenant's token passes its
-- own, an operator's passes the one its request filters by, if any.

-- name: api_token_insert
-- A new token, of the tenant named %(tenant)s (its external id) if one is
-- given; no row when that tenant does not exist.
INSERT INTO {schema}.api_tokens (name, scope, tenant_id, token_sha256, shown_prefix)
SELECT %(name)s, %(scope)s, t.id, %(digest)s, %(shown_prefix)s
FROM (SELECT CAST(%(tenant)s AS text) AS external_id) AS given
LEFT JOIN {schema}.tenants AS t ON t.external_id = given.external_id
WHERE given.external_id IS NULL OR t.id IS NOT NULL
RETURNING id

-- name: api_token_list
-- Every token, revoked ones too (the audit log names them), by id.
SELECT k.id, k.name, k.scope, t.external_id AS tenant, k.shown_prefix, k.created_at,
       k.last_used_at, k.revoked_at
FROM {schema}.api_tokens AS k
LEFT JOIN {schema}.tenants AS t ON t.id = k.tenant_id
ORDER BY k.id

-- name: api_token_revoke
-- Revoke a token: its row is kept. found: whether the id names a token;
-- revoked: whether this call revoked it (false if it was already).
WITH revoked AS (
    UPDATE {schema}.api_tokens SET revoked_at = now()
    WHERE id = %(id)s AND revoked_at IS NULL
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM {schema}.api_tokens WHERE id = %(id)s) AS found,
       EXISTS (SELECT 1 FROM revoked) AS revoked

-- name: api_token_find
-- The token whose SHA-256 is %(digest)s, unless revoked (one probe of the
-- unique index), with its tenant; its last use recorded at most once a minute,
-- so that a busy client costs one write a minute, not one a request.
WITH found AS (
    SELECT k.id, k.name, k.scope, k.tenant_id, t.external_id AS tenant, k.last_used_at
    FROM {schema}.api_tokens AS k
    LEFT JOIN {schema}.tenants AS t ON t.id = k.tenant_id
    WHERE k.token_sha256 = %(digest)s AND k.revoked_at IS NULL
), touched AS (
    UPDATE {schema}.api_tokens AS k SET last_used_at = now()
    FROM found
    WHERE k.id = found.id
      AND (found.last_used_at IS NULL OR found.last_used_at < now() - interval '1 minute')
)
SELECT id AS token_id, name, scope, tenant_id, tenant FROM found

-- name: api_audit_insert
INSERT INTO {schema}.audit_log
    (token_id, token_name, tenant_id, action, resource, resource_id, before_sha256,
     after_sha256, detail)
VALUES (%(token_id)s, %(token_name)s, %(tenant_id)s, %(action)s, %(resource)s,
        %(resource_id)s, %(before)s, %(after)s, CAST(%(detail)s AS jsonb))

-- name: api_audit_page
-- The audit log, newest first, before id %(before)s.
SELECT id, at, token_id, token_name, tenant_id, action, resource, resource_id,
       before_sha256, after_sha256, detail
FROM {schema}.audit_log
WHERE id < %(before)s
ORDER BY id DESC
LIMIT %(limit)s

-- name: api_cursor_key
-- The key page cursors are signed with: made by the migration, one per
-- database, so that every process serving it accepts the cursors of the others.
SELECT key FROM {schema}.api_cursor_key

-- name: api_tenant_id
-- The row id of the tenant whose external id is %(external_id)s.
SELECT id FROM {schema}.tenants WHERE external_id = %(external_id)s

-- fragment: endpoint_view
-- An endpoint as the API shows it: no credential, no TLS material, its signing
-- secrets as stored (the handler shows each by its fingerprint, opened with the
-- server's keys), its tenant by external id.
SELECT e.id, e.url, e.description, e.event_types, e.metadata, e.enabled,
       e.disabled_reason, e.disabled_at, e.failure_streak, e.failing_since,
       e.last_success_at, e.max_concurrency, e.rate_limit_per_s, e.rate_burst, e.filter,
       CAST(e.retry_schedule AS double precision[]) AS retry_schedule,
       e.tenant_id, t.external_id AS tenant,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                            'secret', s.secret, 'key_id', s.key_id,
                            'expires_at', s.expires_at)
                        ORDER BY s.id DESC)
                 FROM {schema}.endpoint_secrets AS s
                 WHERE s.endpoint_id = e.id
                   AND (s.expires_at IS NULL OR s.expires_at > now())), '[]') AS secrets,
       e.auth_header_names, e.auth_scheme, e.created_at, e.updated_at
FROM {schema}.endpoints AS e
LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id

-- name: api_endpoint_get
-- One endpoint, if it is the tenant's (any, without %(tenant_id)s).
{endpoint_view}
WHERE e.id = %(id)s
  AND (CAST(%(tenant_id)s AS bigint) IS NULL OR e.tenant_id = CAST(%(tenant_id)s AS bigint))

-- name: api_endpoint_lock
-- Before a change: the endpoint's row lock, if it is the tenant's (the
-- library's change takes it again, in the same transaction).
SELECT id FROM {schema}.endpoints
WHERE id = %(id)s
  AND (CAST(%(tenant_id)s AS bigint) IS NULL OR tenant_id = CAST(%(tenant_id)s AS bigint))
FOR UPDATE

-- name: api_endpoint_page
-- A page of endpoints by id, after id %(after)s: the tenant's only (on
-- endpoints_tenant_idx) with %(tenant_id)s, enabled or disabled ones only
-- with %(enabled)s.
{endpoint_view}
WHERE e.id > %(after)s
  AND (CAST(%(tenant_id)s AS bigint) IS NULL OR e.tenant_id = CAST(%(tenant_id)s AS bigint))
  AND (CAST(%(enabled)s AS boolean) IS NULL OR e.enabled = CAST(%(enabled)s AS boolean))
ORDER BY e.id
LIMIT %(limit)s

-- fragment: of_tenant
-- Whether the message m belongs to tenant %(tenant_id)s (always, without one):
-- its endpoint is one of the tenant's. A message without an endpoint, or
-- whose endpoint was deleted, belongs to no tenant.
(CAST(%(tenant_id)s AS bigint) IS NULL
 OR EXISTS (SELECT 1 FROM {schema}.endpoints AS te
            WHERE te.id = m.endpoint_id AND te.tenant_id = CAST(%(tenant_id)s AS bigint)))

-- name: api_messages
-- Messages matching every filter given, newest first, older than id
-- %(before)s: the hot table's and the history's, each cut at the limit before
-- the two are merged (as the dashboard's search does). A filter left NULL
-- matches every message; the state 'delivered' names the history.
(SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url) AS url, m.endpoint_id,
        m.event_type, CAST(m.state AS text) AS state, m.attempts, m.last_status,
        m.created_at
 FROM (SELECT *
       FROM {schema}.messages AS m
       WHERE m.id < %(before)s
         AND (CAST(%(key)s AS text) IS NULL OR m.idempotency_key = CAST(%(key)s AS text))
         AND (CAST(%(event_type)s AS text) IS NULL
              OR m.event_type = CAST(%(event_type)s AS text))
         AND (CAST(%(endpoint_id)s AS bigint) IS NULL
              OR m.endpoint_id = CAST(%(endpoint_id)s AS bigint))
         AND (CAST(%(state)s AS text) IS NULL OR m.state = CAST(%(state)s AS text))
         AND (CAST(%(created_from)s AS timestamptz) IS NULL
              OR m.created_at >= CAST(%(created_from)s AS timestamptz))
         AND (CAST(%(created_until)s AS timestamptz) IS NULL
              OR m.created_at < CAST(%(created_until)s AS timestamptz))
         AND {of_tenant}
       ORDER BY m.id DESC
       LIMIT %(limit)s) AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id)
UNION ALL
(SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url), m.endpoint_id, m.event_type,
        'delivered', m.attempts, m.last_status, m.created_at
 FROM (SELECT *
       FROM {schema}.delivered AS m
       WHERE m.id < %(before)s
         AND (CAST(%(state)s AS text) IS NULL OR CAST(%(state)s AS text) = 'delivered')
         AND (CAST(%(key)s AS text) IS NULL OR m.idempotency_key = CAST(%(key)s AS text))
         AND (CAST(%(event_type)s AS text) IS NULL
              OR m.event_type = CAST(%(event_type)s AS text))
         AND (CAST(%(endpoint_id)s AS bigint) IS NULL
              OR m.endpoint_id = CAST(%(endpoint_id)s AS bigint))
         AND (CAST(%(created_from)s AS timestamptz) IS NULL
              OR (m.created_at >= CAST(%(created_from)s AS timestamptz)
                  AND m.completed_at >= CAST(%(created_from)s AS timestamptz)))
         AND (CAST(%(created_until)s AS timestamptz) IS NULL
              OR m.created_at < CAST(%(created_until)s AS timestamptz))
         AND {of_tenant}
       ORDER BY m.id DESC
       LIMIT %(limit)s) AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id)
ORDER BY id DESC
LIMIT %(limit)s

-- name: api_message_visible
-- Whether message %(id)s (waiting, dead or delivered) is the tenant's.
SELECT EXISTS (SELECT 1 FROM {schema}.messages AS m WHERE m.id = %(id)s AND {of_tenant})
    OR EXISTS (SELECT 1 FROM {schema}.delivered AS m WHERE m.id = %(id)s AND {of_tenant})
    AS visible

-- name: api_dead_page
-- Dead messages matching every filter given, newest first (by id), before id
-- %(before)s. A message of a deleted endpoint keeps its endpoint id in its
-- target (as the library's dead_list reads it), but belongs to no tenant.
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
  AND {of_tenant}
ORDER BY m.id DESC
LIMIT %(limit)s

-- name: api_dead_ids
-- The ids of the dead messages of a tenant's selection (ids, filters, or all
-- of its dead messages), at most %(limit)s, for the library's retry and purge.
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

-- name: api_sealed_secrets
-- Whether any signing secret is sealed: then one made without a key would be
-- the one stored in plain text.
SELECT EXISTS (SELECT 1 FROM {schema}.endpoint_secrets WHERE key_id IS NOT NULL) AS sealed
