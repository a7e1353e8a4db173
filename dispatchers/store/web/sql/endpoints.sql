-- Endpoints as the web surfaces show them (the management API, the dashboard,
-- the consumer portal). %(tenant_id)s scopes every statement: NULL is the
-- operator (every endpoint), a tenant's row id keeps to that tenant's
-- endpoints (endpoints_tenant_idx), so that another's reads as a missing one.

-- fragment: of_tenant
-- Whether endpoint e is in the scope of %(tenant_id)s.
(CAST(%(tenant_id)s AS bigint) IS NULL OR e.tenant_id = CAST(%(tenant_id)s AS bigint))

-- fragment: endpoint_shown
-- An endpoint as shown: no credential, no TLS material, its signing secrets in
-- force as stored (a surface shows each by its fingerprint, opened with its
-- keys, newest first), its tenant by external id.
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

-- name: web_endpoint_get
-- One endpoint in scope; no row for an id that is missing or another's.
{endpoint_shown}
WHERE e.id = %(id)s AND {of_tenant}

-- name: web_endpoint_lock
-- Before a change: the endpoint's row lock, if it is in scope (the library's
-- change takes it again, in the same transaction).
SELECT e.id FROM {schema}.endpoints AS e
WHERE e.id = %(id)s AND {of_tenant}
FOR UPDATE

-- name: web_endpoint_page
-- A page of the endpoints in scope by id, after id %(after)s (keyset: a range
-- scan of endpoints_pkey, or of endpoints_tenant_idx for a tenant), at most
-- %(limit)s. Filters: %(untenanted)s, those of no tenant; %(enabled)s, enabled
-- or disabled ones only; %(attention)s, those disabled, failing or with dead
-- messages (messages_endpoint_idx).
{endpoint_shown}
WHERE e.id > %(after)s
  AND {of_tenant}
  AND (NOT CAST(%(untenanted)s AS boolean) OR e.tenant_id IS NULL)
  AND (CAST(%(enabled)s AS boolean) IS NULL OR e.enabled = CAST(%(enabled)s AS boolean))
  AND (NOT CAST(%(attention)s AS boolean) OR NOT e.enabled OR e.failure_streak > 0
       -- a probe of the endpoint's messages per endpoint (not EXISTS, which
       -- the planner may hash over every dead message of the queue)
       OR (SELECT 1 FROM {schema}.messages AS m
           WHERE m.endpoint_id = e.id AND m.state = 'dead' LIMIT 1) IS NOT NULL)
ORDER BY e.id
LIMIT %(limit)s

-- name: web_endpoint_backlog
-- The messages pending and dead of the endpoints %(ids)s in scope (a page's, at
-- most a hundred), counted on messages_endpoint_idx for these endpoints only.
SELECT e.id AS endpoint_id, c.pending, c.dead
FROM {schema}.endpoints AS e
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE m.state IN ('ready', 'running', 'paused')) AS pending,
           count(*) FILTER (WHERE m.state = 'dead') AS dead
    FROM {schema}.messages AS m
    WHERE m.endpoint_id = e.id
) AS c
WHERE e.id = ANY (CAST(%(ids)s AS bigint[])) AND {of_tenant}

-- name: web_endpoint_tenants
-- The tenants of the endpoints %(ids)s (a page's, at most a hundred), by
-- endpoints_pkey: the rows the library's functions return (the dead letters,
-- the overview's endpoints) name their endpoint, not its tenant.
SELECT e.id, t.external_id AS tenant
FROM {schema}.endpoints AS e
JOIN {schema}.tenants AS t ON t.id = e.tenant_id
WHERE e.id = ANY (CAST(%(ids)s AS bigint[]))

-- name: web_tenant_id
-- The row id of the tenant whose external id is %(external_id)s.
SELECT id FROM {schema}.tenants WHERE external_id = %(external_id)s

-- name: web_sealed_secrets
-- Whether any signing secret is sealed: then a secret made without a key would
-- be the one stored in plain text.
SELECT EXISTS (SELECT 1 FROM {schema}.endpoint_secrets WHERE key_id IS NOT NULL) AS sealed
