-- Tenants (migration 0024): outbox.tenants writes and reads them; an endpoint's
-- tenant is written by outbox.endpoints (endpoint_insert).

-- fragment: tenant_rows
-- A tenant as outbox.tenants reads it, with how many endpoints it has.
SELECT t.id, t.external_id, t.name, t.metadata, t.rate_limit_per_s, t.rate_burst,
       CAST(t.retry_schedule AS double precision[]) AS retry_schedule,
       t.created_at, t.updated_at,
       (SELECT count(*) FROM {schema}.endpoints AS e WHERE e.tenant_id = t.id) AS endpoints
FROM {schema}.tenants AS t

-- name: tenant_insert
-- A new tenant; no row when its external id is taken.
INSERT INTO {schema}.tenants (external_id, name, metadata, rate_limit_per_s, rate_burst,
                              retry_schedule)
VALUES (%(external_id)s, %(name)s, CAST(%(metadata)s AS jsonb), %(rate_limit)s, %(burst)s,
        CAST(%(retry_schedule)s AS double precision[]))
ON CONFLICT (external_id) DO NOTHING
RETURNING id

-- name: tenant_get
{tenant_rows}
WHERE t.external_id = %(external_id)s

-- name: tenant_list
-- A page of tenants by external id, after a cursor (the last one seen).
{tenant_rows}
WHERE CAST(%(after)s AS text) IS NULL OR t.external_id > %(after)s
ORDER BY t.external_id
LIMIT %(limit)s

-- name: tenant_update
-- The given fields (set_*), the others kept; no row when there is no such tenant.
UPDATE {schema}.tenants
SET name = CASE WHEN %(set_name)s THEN %(name)s ELSE name END,
    metadata = CASE WHEN %(set_metadata)s THEN CAST(%(metadata)s AS jsonb) ELSE metadata END,
    rate_limit_per_s = CASE WHEN %(set_rate)s THEN %(rate_limit)s ELSE rate_limit_per_s END,
    rate_burst = CASE WHEN %(set_rate)s THEN %(burst)s ELSE rate_burst END,
    retry_schedule = CASE WHEN %(set_retry_schedule)s
                          THEN CAST(%(retry_schedule)s AS double precision[])
                          ELSE retry_schedule END,
    updated_at = now()
WHERE external_id = %(external_id)s
RETURNING id

-- name: tenant_defaults
-- What an endpoint added to the tenant takes unless given its own. The key
-- share lock makes a concurrent deletion of the tenant wait for this
-- transaction, or this read wait for the deletion and find no tenant.
SELECT id, rate_limit_per_s, rate_burst,
       CAST(retry_schedule AS double precision[]) AS retry_schedule
FROM {schema}.tenants
WHERE external_id = %(external_id)s
FOR KEY SHARE

-- name: tenant_lock
-- Before a deletion: the tenant's row, locked, so that no endpoint is added to
-- it meanwhile (tenant_defaults waits).
SELECT id FROM {schema}.tenants WHERE external_id = %(external_id)s FOR UPDATE

-- name: tenant_endpoint_ids
SELECT id FROM {schema}.endpoints WHERE tenant_id = %(id)s ORDER BY id

-- name: tenant_delete
DELETE FROM {schema}.tenants WHERE id = %(id)s
