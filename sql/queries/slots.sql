-- The slot rows of destination policies, made to match the policies as stored
-- after each change (outbox.endpoints, outbox.destinations): concurrency slots
-- (destination_slots) and rate slots (rate_slots), keyed by destination. How the
-- claim uses them: migration 0014. Placeholders as in enqueue.sql.

-- fragment: slots_synced
-- Make the slots of the destination in "bounds" (one row: destination,
-- max_concurrency, rate_limit_per_s, rate_burst; NULL: no such bound) match it.
-- Concurrency slots: the missing ones added, those above the cap deleted. Every
-- request in flight there then holds a slot within the cap, or is listed in
-- unseated_requests (migration 0021) when there is none left for it, and takes
-- the next one that frees ("slots_passed" in the dispatcher's complete.sql,
-- dispatchers/store/sql). So the free slots are the new cap less the requests
-- in flight, and none while more are in flight than it: no request starts
-- until the destination is under the new cap. Rate slots: rate_burst of them, each usable once every
-- rate_burst / rate_limit_per_s seconds; a slot kept keeps its next_at, so that
-- a change never grants a fresh burst.
cap_removed AS (
    DELETE FROM {schema}.destination_slots AS s
    USING bounds AS b
    WHERE s.destination = b.destination AND s.slot > COALESCE(b.max_concurrency, 0)
    RETURNING s.destination, s.message_id
), cap_waiting AS (
    -- the requests in flight there that need a slot, numbered by id: the holders
    -- of the slots deleted, and those that hold none (listed already, or claimed
    -- before there was a cap); none when there is no cap
    SELECT w.destination, w.message_id, row_number() OVER (ORDER BY w.message_id) AS n
    FROM (
        SELECT destination, message_id FROM cap_removed WHERE message_id IS NOT NULL
        UNION
        SELECT m.destination, m.id
        FROM bounds AS b
        JOIN {schema}.messages AS m ON m.state = 'running' AND m.destination = b.destination
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.destination_slots AS s WHERE s.message_id = m.id)
    ) AS w
    JOIN bounds AS b ON b.destination = w.destination AND b.max_concurrency IS NOT NULL
), cap_seats AS (
    -- the slots within the cap that are free or missing, numbered: the k-th
    -- seats the k-th request waiting, or is free
    SELECT b.destination, g AS slot, s.slot IS NOT NULL AS present,
           row_number() OVER (ORDER BY g) AS n
    FROM bounds AS b
    CROSS JOIN generate_series(1, COALESCE(b.max_concurrency, 0)) AS g
    LEFT JOIN {schema}.destination_slots AS s ON s.destination = b.destination AND s.slot = g
    WHERE s.message_id IS NULL
), cap_added AS (
    INSERT INTO {schema}.destination_slots (destination, slot, message_id)
    SELECT c.destination, c.slot, w.message_id
    FROM cap_seats AS c
    LEFT JOIN cap_waiting AS w USING (destination, n)
    WHERE NOT c.present
    ON CONFLICT DO NOTHING
    RETURNING message_id
), cap_reseated AS (
    -- a slot a claim took meanwhile fails the re-checked predicate: its request
    -- is listed instead
    UPDATE {schema}.destination_slots AS s
    SET message_id = w.message_id
    FROM cap_seats AS c
    JOIN cap_waiting AS w USING (destination, n)
    WHERE c.present AND s.destination = c.destination AND s.slot = c.slot
      AND s.message_id IS NULL
    RETURNING s.message_id
), cap_seated AS (
    SELECT message_id FROM cap_added WHERE message_id IS NOT NULL
    UNION ALL
    SELECT message_id FROM cap_reseated
), cap_listed AS (
    INSERT INTO {schema}.unseated_requests (message_id, destination)
    SELECT w.message_id, w.destination
    FROM cap_waiting AS w
    WHERE w.message_id NOT IN (SELECT message_id FROM cap_seated)
    ON CONFLICT (message_id) DO NOTHING
), cap_unlisted AS (
    -- seated now, or no cap to wait for
    DELETE FROM {schema}.unseated_requests AS u
    USING bounds AS b
    WHERE u.destination = b.destination
      AND (b.max_concurrency IS NULL OR u.message_id IN (SELECT message_id FROM cap_seated))
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
