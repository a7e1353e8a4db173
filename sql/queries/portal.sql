-- Consumer portal links: outbox.portal makes, finds and revokes them; the pages
-- they open are dispatchers/portal's. A link is found by the SHA-256 digest of
-- its token (portal_links_token_hash_key), never by the token itself.

-- name: portal_link_insert
-- A link for the tenant named by its external id, expiring %(seconds)s after
-- now; no row when there is no such tenant. Links of the tenant that expired
-- more than %(forget)s seconds ago are deleted first, so that making links keeps
-- no more of them than a few periods' worth (portal_links_tenant_idx).
WITH tenant AS (
    SELECT t.id FROM {schema}.tenants AS t WHERE t.external_id = %(tenant)s
), forgotten AS (
    DELETE FROM {schema}.portal_links AS l
    USING tenant
    WHERE l.tenant_id = tenant.id
      AND l.expires_at < now() - make_interval(secs => %(forget)s)
)
INSERT INTO {schema}.portal_links (token_hash, tenant_id, expires_at)
SELECT %(token_hash)s, tenant.id, now() + make_interval(secs => %(seconds)s)
FROM tenant
RETURNING id, expires_at

-- name: portal_link_find
-- The link whose token has this digest, with its tenant, if it has neither
-- expired nor been revoked: by the unique index on the digest.
SELECT l.id, l.tenant_id, t.external_id AS tenant, t.name AS tenant_name, l.expires_at
FROM {schema}.portal_links AS l
JOIN {schema}.tenants AS t ON t.id = l.tenant_id
WHERE l.token_hash = %(token_hash)s
  AND l.revoked_at IS NULL
  AND l.expires_at > now()

-- name: portal_link_revoke
-- Revoke the link whose token has this digest; no row when there is none, or
-- it was revoked already.
UPDATE {schema}.portal_links
SET revoked_at = now()
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
RETURNING id

-- name: portal_links_revoke_tenant
-- Revoke every link of a tenant that still works; one row per link revoked.
UPDATE {schema}.portal_links AS l
SET revoked_at = now()
FROM {schema}.tenants AS t
WHERE t.external_id = %(tenant)s
  AND l.tenant_id = t.id
  AND l.revoked_at IS NULL
  AND l.expires_at > now()
RETURNING l.id

-- name: portal_tenant_id
-- The tenant's key, by its external id.
SELECT id FROM {schema}.tenants WHERE external_id = %(tenant)s
