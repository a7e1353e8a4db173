-- The slot rows of destination policies, made to match the policies as stored
-- after each change (outbox.endpoints, outbox.destinations): concurrency slots
-- (destination_slots) and rate slots (rate_slots), keyed by destination. How the
-- claim uses them: migration 0014. Placeholders as in enqueue.sql.

-- fragment: slots_synced
-- Make the slots of the destination in "bounds" (one row: destination,
-- max_concurrency, rate_limit_per_s, rate_burst; NULL: no such bound) match it.
-- Concurrency slots: the missing ones added, those above the cap deleted. A
-- holder of a deleted slot moves to a free one at or below the cap, while there
-- is one; the rest hold none (their completion then frees nothing). So the
-- free slots are the new cap less the requests in flight, and none when more
-- are in flight than it: no request starts until the destination is under the
-- new cap. Rate slots: rate_burst of them,
-- each usable once every rate_burst / rate_limit_per_s seconds; a slot kept
-- keeps its next_at, so that a change never grants a fresh burst.
cap_added AS (
    INSERT INTO {schema}.destination_slots (destination, slot)
    SELECT b.destination, g
    FROM bounds AS b
    CROSS JOIN generate_series(1, COALESCE(b.max_concurrency, 0)) AS g
    ON CONFLICT DO NOTHING
), cap_removed AS (
    DELETE FROM {schema}.destination_slots AS s
    USING bounds AS b
    WHERE s.destination = b.destination AND s.slot > COALESCE(b.max_concurrency, 0)
    RETURNING s.destination, s.message_id
), cap_unseated AS (
    -- the holders of deleted slots, numbered
    SELECT destination, message_id,
           row_number() OVER (PARTITION BY destination ORDER BY message_id) AS n
    FROM cap_removed
    WHERE message_id IS NOT NULL
), cap_vacant AS (
    -- the free slots kept, numbered
    SELECT s.destination, s.slot,
           row_number() OVER (PARTITION BY s.destination ORDER BY s.slot) AS n
    FROM {schema}.destination_slots AS s
    JOIN bounds AS b ON b.destination = s.destination
    WHERE s.slot <= COALESCE(b.max_concurrency, 0) AND s.message_id IS NULL
), cap_reseated AS (
    -- the k-th unseated holder takes the k-th free slot; a slot a claim took
    -- meanwhile fails the re-checked predicate and is left to it
    UPDATE {schema}.destination_slots AS s
    SET message_id = u.message_id
    FROM cap_vacant AS v
    JOIN cap_unseated AS u USING (destination, n)
    WHERE s.destination = v.destination AND s.slot = v.slot AND s.message_id IS NULL
), rate_wanted AS (
    SELECT b.destination, g AS slot,
           make_interval(secs => b.rate_burst / b.rate_limit_per_s) AS period
    FROM bounds AS b
    CROSS JOIN generate_series(1, COALESCE(b.rate_burst, 0)) AS g
), rate_removed AS (
    DELETE FROM {schema}.rate_slots AS s
    USING bounds AS b
    WHERE s.destination = b.destination AND s.slot > COALESCE(b.rate_burst, 0)
), rate_kept AS (
    INSERT INTO {schema}.rate_slots (destination, slot, period)
    SELECT destination, slot, period FROM rate_wanted
    ON CONFLICT (destination, slot) DO UPDATE SET period = EXCLUDED.period
)

-- name: endpoint_slots_sync
-- Make an endpoint's slots match its max_concurrency and rate limit; after the
-- endpoint is deleted, remove them.
WITH bounds AS (
    SELECT 'endpoint:' || CAST(%(id)s AS bigint) AS destination,
           e.max_concurrency, e.rate_limit_per_s, e.rate_burst
    FROM (VALUES (1)) AS one
    LEFT JOIN {schema}.endpoints AS e ON e.id = %(id)s
), {slots_synced}
SELECT 1

-- name: destination_slots_sync
-- Make a plain destination's slots match its policy; after the policy is
-- deleted, remove them.
WITH bounds AS (
    SELECT CAST(%(destination)s AS text) AS destination,
           p.max_concurrency, p.rate_limit_per_s, p.rate_burst
    FROM (VALUES (1)) AS one
    LEFT JOIN {schema}.destination_policies AS p ON p.destination = %(destination)s
), {slots_synced}
SELECT 1
