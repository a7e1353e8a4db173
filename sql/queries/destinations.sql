-- Policies of plain destinations (outbox.destinations); their slots are in
-- slots.sql. Placeholders as in enqueue.sql.

-- fragment: policy_rows
SELECT p.destination, p.max_concurrency, p.rate_limit_per_s, p.rate_burst,
       p.created_at, p.updated_at
FROM {schema}.destination_policies AS p

-- name: destination_policy_set
-- Replace the policy of a destination (or create it); destination_slots_sync
-- follows.
INSERT INTO {schema}.destination_policies AS p (
    destination, max_concurrency, rate_limit_per_s, rate_burst
)
VALUES (%(destination)s, %(max_concurrency)s, %(rate_limit)s, %(burst)s)
ON CONFLICT (destination) DO UPDATE
SET max_concurrency = EXCLUDED.max_concurrency,
    rate_limit_per_s = EXCLUDED.rate_limit_per_s,
    rate_burst = EXCLUDED.rate_burst,
    updated_at = now()
RETURNING p.destination, p.max_concurrency, p.rate_limit_per_s, p.rate_burst,
          p.created_at, p.updated_at

-- name: destination_policy_get
{policy_rows}
WHERE p.destination = %(destination)s

-- name: destination_policy_list
{policy_rows}
ORDER BY p.destination

-- name: destination_policy_delete
-- Its concurrency slots go with it (ON DELETE CASCADE), its rate slots here.
WITH removed AS (
    DELETE FROM {schema}.destination_policies
    WHERE destination = %(destination)s
    RETURNING destination
), rate_slots AS (
    DELETE FROM {schema}.rate_slots
    WHERE destination IN (SELECT destination FROM removed)
)
SELECT destination FROM removed
