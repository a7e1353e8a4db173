-- The management API's own tables: its tokens, its audit log and the key its
-- page cursors are signed with. Operator-only: no tenant reads them.

-- name: web_token_insert
-- A new token, of the tenant named %(tenant)s (its external id) if one is
-- given; no row when that tenant does not exist.
INSERT INTO {schema}.api_tokens (name, scope, tenant_id, token_sha256, shown_prefix)
SELECT %(name)s, %(scope)s, t.id, %(digest)s, %(shown_prefix)s
FROM (SELECT CAST(%(tenant)s AS text) AS external_id) AS given
LEFT JOIN {schema}.tenants AS t ON t.external_id = given.external_id
WHERE given.external_id IS NULL OR t.id IS NOT NULL
RETURNING id

-- name: web_token_list
-- Every token, revoked ones too (the audit log names them), by id.
SELECT k.id, k.name, k.scope, t.external_id AS tenant, k.shown_prefix, k.created_at,
       k.last_used_at, k.revoked_at
FROM {schema}.api_tokens AS k
LEFT JOIN {schema}.tenants AS t ON t.id = k.tenant_id
ORDER BY k.id

-- name: web_token_revoke
-- Revoke a token: its row is kept. found: whether the id names a token;
-- revoked: whether this call revoked it (false if it was already).
WITH revoked AS (
    UPDATE {schema}.api_tokens SET revoked_at = now()
    WHERE id = %(id)s AND revoked_at IS NULL
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM {schema}.api_tokens WHERE id = %(id)s) AS found,
       EXISTS (SELECT 1 FROM revoked) AS revoked

-- name: web_token_find
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

-- name: web_audit_insert
INSERT INTO {schema}.audit_log
    (token_id, token_name, tenant_id, action, resource, resource_id, before_sha256,
     after_sha256, detail)
VALUES (%(token_id)s, %(token_name)s, %(tenant_id)s, %(action)s, %(resource)s,
        %(resource_id)s, %(before)s, %(after)s, CAST(%(detail)s AS jsonb))

-- name: web_audit_page
-- The audit log, newest first, before id %(before)s.
SELECT id, at, token_id, token_name, tenant_id, action, resource, resource_id,
       before_sha256, after_sha256, detail
FROM {schema}.audit_log
WHERE id < %(before)s
ORDER BY id DESC
LIMIT %(limit)s

-- name: web_cursor_key
-- The key page cursors are signed with: made by the migration, one per
-- database, so that every process serving it accepts the cursors of the others.
SELECT key FROM {schema}.api_cursor_key
