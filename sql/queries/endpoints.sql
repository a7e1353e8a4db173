-- Webhook endpoints: create, read, change, disable, enable, delete
-- (outbox.endpoints). Placeholders as in enqueue.sql.

-- name: endpoint_insert
-- An endpoint; its first signing secret follows (endpoint_secret_insert), sealed
-- for the id this returns.
INSERT INTO {schema}.endpoints (
    url, description, event_types, metadata, max_concurrency, rate_limit_per_s, rate_burst,
    filter, retry_schedule, tenant_id
)
VALUES (%(url)s, %(description)s, CAST(%(event_types)s AS text[]),
        CAST(%(metadata)s AS jsonb), %(max_concurrency)s, %(rate_limit)s, %(burst)s,
        %(filter)s, CAST(%(retry_schedule)s AS double precision[]), %(tenant_id)s)
RETURNING id

-- name: endpoint_secret_insert
-- An endpoint's first signing secret, as stored (key_id NULL: plain text).
INSERT INTO {schema}.endpoint_secrets (endpoint_id, secret, key_id)
VALUES (%(id)s, %(secret)s, %(key_id)s)

-- fragment: endpoint_rows
-- An endpoint as outbox.endpoints reads it, with its signing secrets.
SELECT e.id, e.url, e.description, e.event_types, e.metadata, e.enabled, e.disabled_reason,
       e.disabled_at, e.failure_streak, e.failing_since, e.last_success_at, e.max_concurrency,
       e.rate_limit_per_s, e.rate_burst, e.created_at, e.updated_at, now(),
       -- its TLS material: the private key as stored (sealed, or plain text)
       e.ca_bundle, e.client_cert, e.client_key, e.client_key_id,
       CAST(e.retry_schedule AS double precision[]) AS retry_schedule,
       -- its signing secrets, newest first (the ids name them to a rotation)
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                            'id', s.id, 'secret', s.secret, 'key_id', s.key_id,
                            'expires_at', s.expires_at)
                        ORDER BY s.id DESC)
                 FROM {schema}.endpoint_secrets AS s
                 WHERE s.endpoint_id = e.id), '[]') AS secrets,
       e.filter,
       -- its credentials: as stored (sealed, or plain text), and what may be shown
       e.auth, e.auth_key_id, e.auth_scheme, e.auth_header_names, e.basic_username,
       e.oauth2_token_url, e.oauth2_client_id, e.oauth2_scope, e.oauth2_audience,
       -- its tenant (migration 0024): the external id, NULL for the operator's own
       t.external_id AS tenant
FROM {schema}.endpoints AS e
LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id

-- name: endpoint_get
{endpoint_rows}
WHERE e.id = %(id)s

-- name: endpoint_lock
-- Before a change: changes of one endpoint take turns on its row lock (the
-- caller then reads the endpoint with endpoint_get).
SELECT id FROM {schema}.endpoints WHERE id = %(id)s FOR UPDATE

-- name: endpoint_list
{endpoint_rows}
ORDER BY e.id

-- name: endpoint_list_tenant
-- A tenant's endpoints (by its external id), by endpoints_tenant_idx.
{endpoint_rows}
WHERE e.tenant_id = (SELECT id FROM {schema}.tenants WHERE external_id = %(tenant)s)
ORDER BY e.id

-- name: endpoint_update
UPDATE {schema}.endpoints
SET url = %(url)s,
    description = %(description)s,
    event_types = CAST(%(event_types)s AS text[]),
    metadata = CAST(%(metadata)s AS jsonb),
    max_concurrency = %(max_concurrency)s,
    rate_limit_per_s = %(rate_limit)s,
    rate_burst = %(burst)s,
    filter = %(filter)s,
    retry_schedule = CAST(%(retry_schedule)s AS double precision[]),
    updated_at = now()
WHERE id = %(id)s
RETURNING id

-- name: endpoint_tls_update
-- An endpoint's TLS material, as stored: its CA bundle, and its client
-- certificate with the private key (sealed under client_key_id, or plain text).
-- The caller holds the endpoint's row lock, or has just inserted it.
UPDATE {schema}.endpoints
SET ca_bundle = %(ca_bundle)s,
    client_cert = %(client_cert)s,
    client_key = %(client_key)s,
    client_key_id = %(client_key_id)s,
    updated_at = now()
WHERE id = %(id)s

-- name: endpoint_auth_update
-- An endpoint's credentials, as stored (sealed under auth_key_id, or plain
-- text), with what may be shown of them. The caller holds the endpoint's row
-- lock, or has just inserted it.
UPDATE {schema}.endpoints
SET auth = %(auth)s,
    auth_key_id = %(auth_key_id)s,
    auth_scheme = %(auth_scheme)s,
    auth_header_names = CAST(%(auth_header_names)s AS text[]),
    basic_username = %(basic_username)s,
    oauth2_token_url = %(oauth2_token_url)s,
    oauth2_client_id = %(oauth2_client_id)s,
    oauth2_scope = %(oauth2_scope)s,
    oauth2_audience = %(oauth2_audience)s,
    updated_at = now()
WHERE id = %(id)s

-- name: endpoint_secret_rotate
-- Sign with a new secret from now on. The retired secrets go (the caller names
-- those that no longer sign, and the new one if it was stored already); those
-- without an expiry keep signing until the given time; the others keep their own
-- expiry. The caller holds the endpoint's row lock (endpoint_lock).
WITH retired AS (
    DELETE FROM {schema}.endpoint_secrets
    WHERE endpoint_id = %(id)s AND id = ANY (CAST(%(retired)s AS bigint[]))
), overlapping AS (
    UPDATE {schema}.endpoint_secrets
    SET expires_at = CAST(%(until)s AS timestamptz)
    WHERE endpoint_id = %(id)s AND expires_at IS NULL
      AND id <> ALL (CAST(%(retired)s AS bigint[]))
)
INSERT INTO {schema}.endpoint_secrets (endpoint_id, secret, key_id)
VALUES (%(id)s, %(secret)s, %(key_id)s)

-- name: secrets_unsealed_count
-- How many signing secrets, client keys and endpoints' credentials are not
-- sealed under the key with id key_id (plain text ones included).
SELECT (SELECT count(*) FROM {schema}.endpoint_secrets
        WHERE key_id IS DISTINCT FROM %(key_id)s)
     + (SELECT count(*) FROM {schema}.endpoints
        WHERE client_key IS NOT NULL AND client_key_id IS DISTINCT FROM %(key_id)s)
     + (SELECT count(*) FROM {schema}.endpoints
        WHERE auth IS NOT NULL AND auth_key_id IS DISTINCT FROM %(key_id)s)

-- name: secrets_to_reseal
-- A batch of signing secrets not sealed under the key with id key_id, locked
-- until the caller writes them sealed (secrets_reseal) in the same transaction.
-- Concurrent rekeys skip each other's batches.
SELECT id, endpoint_id, secret, key_id
FROM {schema}.endpoint_secrets
WHERE key_id IS DISTINCT FROM %(key_id)s
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: secrets_reseal
-- Write a batch of signing secrets sealed again, all under key_id.
UPDATE {schema}.endpoint_secrets AS s
SET secret = r.secret, key_id = %(key_id)s
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(secrets)s AS text[])) AS r(id, secret)
WHERE s.id = r.id

-- name: client_keys_to_reseal
-- As secrets_to_reseal, for the endpoints' client keys (the id is the endpoint's).
SELECT id, id AS endpoint_id, client_key AS secret, client_key_id AS key_id
FROM {schema}.endpoints
WHERE client_key IS NOT NULL AND client_key_id IS DISTINCT FROM %(key_id)s
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: client_keys_reseal
-- Write a batch of client keys sealed again, all under key_id.
UPDATE {schema}.endpoints AS e
SET client_key = r.secret, client_key_id = %(key_id)s
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(secrets)s AS text[])) AS r(id, secret)
WHERE e.id = r.id

-- name: auth_to_reseal
-- As secrets_to_reseal, for the endpoints' credentials (the id is the endpoint's).
SELECT id, id AS endpoint_id, auth AS secret, auth_key_id AS key_id
FROM {schema}.endpoints
WHERE auth IS NOT NULL AND auth_key_id IS DISTINCT FROM %(key_id)s
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: auth_reseal
-- Write a batch of endpoints' credentials sealed again, all under key_id.
UPDATE {schema}.endpoints AS e
SET auth = r.secret, auth_key_id = %(key_id)s
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(secrets)s AS text[])) AS r(id, secret)
WHERE e.id = r.id

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
-- readable) and name it no more (a message names an endpoint or a URL, 0034),
-- and the ones still waiting become dead.
UPDATE {schema}.messages AS m
SET url = e.url,
    endpoint_id = NULL,
    state = CASE WHEN m.state IN ('ready', 'paused') THEN 'dead' ELSE m.state END,
    last_error = CASE WHEN m.state IN ('ready', 'paused') THEN 'endpoint deleted'
                      ELSE m.last_error END,
    completed_at = CASE WHEN m.state IN ('ready', 'paused') THEN now() ELSE m.completed_at END
FROM {schema}.endpoints AS e
WHERE e.id = %(id)s AND m.endpoint_id = e.id
RETURNING m.id

-- name: endpoint_delete
DELETE FROM {schema}.endpoints WHERE id = %(id)s RETURNING id
