-- The slot rows of destination policies, made to match the policies as stored
-- after each change (outbox.endpoints, outbox.destinations): concurrency slots
-- (endpoint_slots, destination_slots) and rate slots (rate_slots). How the
-- claim uses them: migrations 0002 and 0014. Placeholders as in enqueue.sql.

-- fragment: rate_slots_synced
-- Make the rate slots of the destination in "limited" (destination,
-- rate_limit_per_s, rate_burst; both NULL: no limit) match its limit: rate_burst
-- slots, each usable once every rate_burst / rate_limit_per_s seconds. A slot
-- kept keeps its next_at, so a change never grants a fresh burst.
wanted AS (
    SELECT l.destination, g AS slot,
           make_interval(secs => l.rate_burst / l.rate_limit_per_s) AS period
    FROM limited AS l
    CROSS JOIN generate_series(1, COALESCE(l.rate_burst, 0)) AS g
), rate_removed AS (
    DELETE FROM {schema}.rate_slots AS s
    USING limited AS l
    WHERE s.destination = l.destination AND s.slot > COALESCE(l.rate_burst, 0)
), rate_kept AS (
    INSERT INTO {schema}.rate_slots (destination, slot, period)
    SELECT destination, slot, period FROM wanted
    ON CONFLICT (destination, slot) DO UPDATE SET period = EXCLUDED.period
)

-- name: endpoint_slots_sync
-- Make an endpoint's slot rows match its max_concurrency (add the missing ones,
-- remove free ones above the cap: held ones go when they are freed) and its rate
-- limit. After the endpoint is deleted, its rate slots go.
WITH endpoint AS (
    SELECT id, COALESCE(max_concurrency, 0) AS cap
    FROM {schema}.endpoints
    WHERE id = %(id)s
), added AS (
    INSERT INTO {schema}.endpoint_slots (endpoint_id, slot)
    SELECT endpoint.id, g FROM endpoint, generate_series(1, endpoint.cap) AS g
    ON CONFLICT DO NOTHING
    RETURNING slot
), removed AS (
    DELETE FROM {schema}.endpoint_slots AS s
    USING endpoint
    WHERE s.endpoint_id = endpoint.id AND s.slot > endpoint.cap AND s.message_id IS NULL
    RETURNING slot
), limited AS (
    SELECT 'endpoint:' || CAST(%(id)s AS bigint) AS destination,
           e.rate_limit_per_s, e.rate_burst
    FROM (VALUES (1)) AS one
    LEFT JOIN {schema}.endpoints AS e ON e.id = %(id)s
), {rate_slots_synced}
SELECT (SELECT count(*) FROM added), (SELECT count(*) FROM removed)

-- name: destination_slots_sync
-- Make a plain destination's slot rows match its policy: its concurrency slots
-- (add the missing ones, delete those above the cap, held or not: a holder's
-- completion then frees nothing, and no request starts until the destination is
-- under the new cap) and its rate slots.
WITH policy AS (
    SELECT destination, COALESCE(max_concurrency, 0) AS cap
    FROM {schema}.destination_policies
    WHERE destination = %(destination)s
), added AS (
    INSERT INTO {schema}.destination_slots (destination, slot)
    SELECT policy.destination, g FROM policy, generate_series(1, policy.cap) AS g
    ON CONFLICT DO NOTHING
), removed AS (
    DELETE FROM {schema}.destination_slots AS s
    USING policy
    WHERE s.destination = policy.destination AND s.slot > policy.cap
), limited AS (
    SELECT destination, rate_limit_per_s, rate_burst
    FROM {schema}.destination_policies
    WHERE destination = %(destination)s
), {rate_slots_synced}
SELECT 1
