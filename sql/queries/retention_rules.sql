-- Retention rules (outbox.retention_rules, migration 0029): how long the
-- delivered messages of one endpoint, or of one event type, keep what they
-- said. Every dispatcher's retention applies them (expire_payloads). Placeholders
-- as in enqueue.sql.

-- fragment: retention_rule_rows
SELECT r.id, r.endpoint_id, r.event_type, r.payload_retention_s, r.erased_until,
       r.created_at, r.updated_at
FROM {schema}.retention_rules AS r

-- name: retention_rule_set_endpoint
-- Create or replace an endpoint's rule; no row when the endpoint does not
-- exist (the caller names the field). erased_until stays: what was erased is
-- gone whatever the new period.
INSERT INTO {schema}.retention_rules AS r (endpoint_id, payload_retention_s)
SELECT e.id, %(payload_retention_s)s
FROM {schema}.endpoints AS e
WHERE e.id = %(endpoint_id)s
ON CONFLICT (endpoint_id) DO UPDATE
SET payload_retention_s = excluded.payload_retention_s, updated_at = now()
RETURNING r.id, r.endpoint_id, r.event_type, r.payload_retention_s, r.erased_until,
          r.created_at, r.updated_at

-- name: retention_rule_set_event_type
-- Create or replace an event type's rule.
INSERT INTO {schema}.retention_rules AS r (event_type, payload_retention_s)
VALUES (%(event_type)s, %(payload_retention_s)s)
ON CONFLICT (event_type) DO UPDATE
SET payload_retention_s = excluded.payload_retention_s, updated_at = now()
RETURNING r.id, r.endpoint_id, r.event_type, r.payload_retention_s, r.erased_until,
          r.created_at, r.updated_at

-- name: retention_rule_get
-- The rule of one endpoint or of one event type (the other parameter NULL).
{retention_rule_rows}
WHERE r.endpoint_id = %(endpoint_id)s OR r.event_type = %(event_type)s

-- name: retention_rule_list
{retention_rule_rows}
ORDER BY r.endpoint_id NULLS LAST, r.event_type

-- name: retention_rule_delete
DELETE FROM {schema}.retention_rules AS r
WHERE r.endpoint_id = %(endpoint_id)s OR r.event_type = %(event_type)s
RETURNING r.id
