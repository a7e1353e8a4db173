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
-- Its slots go next (destination_slots_sync).
DELETE FROM {schema}.destination_policies
WHERE destination = %(destination)s
RETURNING destination

-- name: status_destinations
-- For outbox status: every destination with a policy (an origin with a row
-- above, an endpoint with a cap or a rate limit), its bounds, and its messages
-- due now and running.
SELECT d.destination, d.max_concurrency, d.rate_limit_per_s, d.rate_burst AS burst,
       (SELECT count(*) FROM {schema}.messages AS m
        WHERE m.destination = d.destination AND m.state = 'ready'
          AND m.available_at <= now()) AS ready,
       (SELECT count(*) FROM {schema}.messages AS m
        WHERE m.destination = d.destination AND m.state = 'running') AS running
FROM (SELECT destination, max_concurrency, rate_limit_per_s, rate_burst
      FROM {schema}.destination_policies
      UNION ALL
      SELECT 'endpoint:' || id, max_concurrency, rate_limit_per_s, rate_burst
      FROM {schema}.endpoints
      WHERE max_concurrency IS NOT NULL OR rate_limit_per_s IS NOT NULL) AS d
ORDER BY d.destination
