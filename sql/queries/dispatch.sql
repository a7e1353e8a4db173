-- The dispatcher's statements (dispatchers.store.postgres, dispatchers.runtime.waker,
-- dispatchers.store.preflight): claim, lease renewal, completion, rescue, retention,
-- the drain check, the session statements around them, and the checks made at
-- start-up. Placeholders as in enqueue.sql, plus "{channel}", the
-- quoted name of the schema's notification channel.

-- fragment: ordering_key_free
-- A message with an ordering key waits while an earlier message of the same key
-- is ready, running or paused, and while any other of the key is running: one
-- moved back from the history (a replay keeps its id) or retried from dead may
-- be earlier than one already sent. A dead one holds no successor back.
(m.ordering_key IS NULL OR NOT EXISTS (
    SELECT 1
    FROM {schema}.messages AS other
    WHERE other.ordering_key = m.ordering_key
      AND other.id <> m.id
      AND other.state IN ('ready', 'running', 'paused')
      AND (other.id < m.id OR other.state = 'running')))

-- fragment: claimable
-- A message "claim" may take: due, its endpoint (if any) enabled, and free of
-- its ordering key (its destination's policy, if any, is "policy_room"'s and
-- "policy_slots"' to apply). A webhook message whose endpoint was disabled
-- after it was written waits (the disable pauses the rows it can see; this
-- catches the ones committed later). The endpoint is one primary key probe per
-- message looked at: a subquery that yields a value, where an EXISTS may be
-- planned as a hash of every endpoint, built at each claim (a generic plan
-- expects a share of the table to be looked at, not the batch).
m.state = 'ready'
AND m.available_at <= now()
AND (m.endpoint_id IS NULL OR (
        SELECT e.enabled FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id))
AND {ordering_key_free}

-- fragment: unpoliced
-- A message of a destination without a policy: an endpoint without a cap or a
-- rate limit, or an origin without a row in destination_policies. One probe of
-- a primary key each, as in "claimable" (and not an EXISTS, for the same reason).
(m.endpoint_id IS NULL OR (
    SELECT e.enabled AND e.max_concurrency IS NULL AND e.rate_limit_per_s IS NULL
    FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id))
AND (m.endpoint_id IS NOT NULL OR (
    SELECT p.destination FROM {schema}.destination_policies AS p
    WHERE p.destination = m.destination) IS NULL)

-- fragment: claimable_uncapped
-- A message "claim_uncapped" may take: as "claimable", of a destination without
-- a policy.
m.state = 'ready'
AND m.available_at <= now()
AND {unpoliced}
AND {ordering_key_free}

-- fragment: health_alone
-- The alone destination takes the short way only while no health row blocks it
-- or owes a probe (a hold that has ended does neither): one primary key probe.
NOT EXISTS (
    SELECT 1 FROM {schema}.destination_health AS dh
    WHERE dh.destination = %(alone)s
      AND (dh.blocked_until > now() OR dh.state <> 'held'))

-- fragment: health_probes
-- The probes this claim may take (see the destination_health migration): of the listed
-- destinations, those whose breaker is open (or whose probe's dispatcher
-- vanished) past its back-off, their rows locked so that of two claimers only
-- one may take each (the other skips the locked row, or re-checks the one
-- committed since and finds it blocked again). One primary key probe per
-- listed destination.
probe_rows AS (
    SELECT dh.destination
    FROM {schema}.destination_health AS dh
    WHERE dh.destination IN (SELECT destination FROM destinations)
      AND dh.state <> 'held' AND dh.blocked_until <= now()
    FOR UPDATE OF dh SKIP LOCKED
)

-- fragment: health_probed
-- The probes this claim took: the locked rows of "health_probes" whose
-- destination it claimed a message of, turned to 'probing' for a lease (a
-- destination with nothing this statement may take stays open, for the next).
probes AS (
    UPDATE {schema}.destination_health AS dh
    SET state = 'probing',
        probe_owner = %(owner)s,
        blocked_until = now() + make_interval(secs => %(lease_s)s),
        updated_at = now()
    FROM probe_rows AS p
    WHERE dh.destination = p.destination
      AND EXISTS (SELECT 1 FROM claimed AS c WHERE c.destination = p.destination)
    RETURNING dh.destination
)

-- fragment: health_joins
-- Each listed destination's health row, if any, and whether this claim took its probe.
LEFT JOIN {schema}.destination_health AS dh ON dh.destination = d.destination
LEFT JOIN probe_rows AS probe ON probe.destination = d.destination

-- fragment: health_admitted
-- A listed destination the claim may take from: no health row, a hold that has
-- ended, or a probe this claim may take (its room is then one message).
(dh.destination IS NULL OR (dh.state = 'held' AND dh.blocked_until <= now())
 OR probe.destination IS NOT NULL)

-- fragment: destination_blocked
-- A message m whose destination a hold or an open breaker blocks now.
EXISTS (
    SELECT 1 FROM {schema}.destination_health AS dh
    WHERE dh.destination = m.destination AND dh.blocked_until > now())

-- fragment: policed_exists
-- One row if some destination has a policy: an endpoint with a cap or a rate
-- limit, or a row in destination_policies ("claim_uncapped" passed over their
-- messages, which "claim" takes with their slots).
-- Two probes, each planned on its own: under one LIMIT, a plan may count on the
-- second table to answer and read every endpoint for the first.
SELECT 1
WHERE EXISTS (SELECT 1 FROM {schema}.endpoints
              WHERE max_concurrency IS NOT NULL OR rate_limit_per_s IS NOT NULL)
   OR EXISTS (SELECT 1 FROM {schema}.destination_policies)

-- fragment: policy_room
-- "policed": the destinations in line for a claim ("listed" and "alone") that
-- have rate slots or concurrency slots (destination_slots), each with how many
-- requests it may start now (its allowance): its free rate slots, its free
-- concurrency slots, the fewer, counted up to the batch. A count of rows read,
-- never trusted to grant anything: the slots are taken in "policy_slots",
-- locked and re-checked there.
policed AS (
    SELECT d.destination, LEAST(r.free, c.free) AS allowance,
           r.free IS NOT NULL AS rated, c.free IS NOT NULL AS capped
    FROM (SELECT destination FROM listed UNION ALL SELECT destination FROM alone) AS d
    LEFT JOIN LATERAL (
        SELECT (SELECT count(*)
                FROM (SELECT 1 FROM {schema}.rate_slots AS s
                      WHERE s.destination = d.destination AND s.next_at <= now()
                      LIMIT %(limit)s) AS f) AS free
        WHERE EXISTS (SELECT 1 FROM {schema}.rate_slots AS s
                      WHERE s.destination = d.destination)
    ) AS r ON true
    LEFT JOIN LATERAL (
        -- none while a request in flight there waits for a slot ("cap_free")
        SELECT CASE WHEN EXISTS (SELECT 1 FROM {schema}.unseated_requests AS u
                                 WHERE u.destination = d.destination)
                    THEN 0
                    ELSE (SELECT count(*)
                          FROM (SELECT 1 FROM {schema}.destination_slots AS s
                                WHERE s.destination = d.destination AND s.message_id IS NULL
                                LIMIT %(limit)s) AS f)
               END AS free
        WHERE EXISTS (SELECT 1 FROM {schema}.destination_slots AS s
                      WHERE s.destination = d.destination)
    ) AS c ON true
    WHERE r.free IS NOT NULL OR c.free IS NOT NULL
)

-- fragment: rate_wait
-- A row without an id when a rate-limited destination was in line: in how many
-- seconds its next rate slot frees (one taken by this claim, or free and left,
-- a period from now), so that the dispatcher claims again then rather than at
-- its next poll (nothing notifies it when a slot frees).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CAST(EXTRACT(epoch FROM min(CASE WHEN s.next_at > now() THEN s.next_at
                                        ELSE now() + s.period END) - now())
            AS double precision)
FROM {schema}.rate_slots AS s
WHERE s.destination IN (SELECT destination FROM policed WHERE rated)
HAVING count(*) > 0

-- fragment: policy_slots
-- The slots of the candidates of "policed" destinations: "admitted" is every
-- candidate that may go, those without a policy and those granted a slot of
-- each kind their destination has. Free slots are locked with SKIP LOCKED and
-- re-checked on their newest version (a rate slot another claimer took since
-- our snapshot has moved its next_at, a concurrency slot has its holder), then
-- handed out in claim order; a candidate left without one stays ready.
policy_candidates AS (
    SELECT c.id, c.destination, p.rated, p.capped,
           row_number() OVER (PARTITION BY c.destination ORDER BY c.available_at, c.id) AS n
    FROM candidates AS c
    JOIN policed AS p USING (destination)
), wanted AS (
    -- slots wanted per destination: one per candidate, so that no more are locked
    SELECT destination, bool_or(rated) AS rated, bool_or(capped) AS capped, count(*) AS n
    FROM policy_candidates
    GROUP BY destination
), rate_free AS (
    SELECT f.destination, f.slot
    FROM wanted AS w
    CROSS JOIN LATERAL (
        SELECT s.destination, s.slot
        FROM {schema}.rate_slots AS s
        WHERE s.destination = w.destination AND s.next_at <= now()
        ORDER BY s.slot
        LIMIT w.n
        FOR UPDATE SKIP LOCKED
    ) AS f
    WHERE w.rated
), cap_free AS (
    SELECT f.destination, f.slot
    FROM wanted AS w
    CROSS JOIN LATERAL (
        SELECT s.destination, s.slot
        FROM {schema}.destination_slots AS s
        WHERE s.destination = w.destination AND s.message_id IS NULL
        ORDER BY s.slot
        LIMIT w.n
        FOR UPDATE SKIP LOCKED
    ) AS f
    -- No free slot is taken while a request in flight there waits for one (listed
    -- in unseated_requests, migration 0021). Normally a slot that frees passes to
    -- it and none is free meanwhile; but a completion that ran beside the cap
    -- change that listed it saw no one waiting and freed its slot.
    WHERE w.capped
      AND NOT EXISTS (SELECT 1 FROM {schema}.unseated_requests AS u
                      WHERE u.destination = w.destination)
), permitted AS (
    SELECT pc.id, pc.destination, r.slot AS rate_slot, k.slot AS cap_slot
    FROM policy_candidates AS pc
    LEFT JOIN (SELECT destination, slot,
                      row_number() OVER (PARTITION BY destination ORDER BY slot) AS n
               FROM rate_free) AS r USING (destination, n)
    LEFT JOIN (SELECT destination, slot,
                      row_number() OVER (PARTITION BY destination ORDER BY slot) AS n
               FROM cap_free) AS k USING (destination, n)
    WHERE (r.slot IS NOT NULL OR NOT pc.rated) AND (k.slot IS NOT NULL OR NOT pc.capped)
), rate_taken AS (
    UPDATE {schema}.rate_slots AS s
    SET next_at = now() + s.period
    FROM permitted AS p
    WHERE s.destination = p.destination AND s.slot = p.rate_slot
), cap_taken AS (
    UPDATE {schema}.destination_slots AS s
    SET message_id = p.id
    FROM permitted AS p
    WHERE s.destination = p.destination AND s.slot = p.cap_slot
), admitted AS (
    SELECT c.id, c.endpoint_id, c.available_at
    FROM candidates AS c
    WHERE c.id NOT IN (SELECT id FROM policy_candidates)
       OR c.id IN (SELECT id FROM permitted)
)

-- fragment: slots_passed
-- The concurrency slots of the messages in "ending" (ids whose requests ended or
-- were given back): each passes to a request in flight to its destination that
-- holds none (listed in unseated_requests, lowest id first), else is freed; and
-- the ending messages leave that list. So a destination's free slots stay its
-- cap less its requests in flight (migration 0021). The list's rows are locked
-- SKIP LOCKED, so that two completions never seat the same request. A slot freed
-- while someone waits (a list row locked elsewhere, or written by a cap change
-- this statement cannot see yet) is not taken by a claim ("cap_free") until the
-- list is empty: the destination may run below its cap for a while, never above.
vacated AS (
    SELECT s.destination, s.slot,
           row_number() OVER (PARTITION BY s.destination ORDER BY s.slot) AS n
    FROM {schema}.destination_slots AS s
    WHERE s.message_id IN (SELECT id FROM ending)
), heirs AS (
    SELECT w.destination, w.message_id,
           row_number() OVER (PARTITION BY w.destination ORDER BY w.message_id) AS n
    FROM (SELECT u.destination, u.message_id
          FROM {schema}.unseated_requests AS u
          WHERE u.destination IN (SELECT destination FROM vacated)
            AND u.message_id NOT IN (SELECT id FROM ending)
          FOR UPDATE SKIP LOCKED) AS w
), freed AS (
    UPDATE {schema}.destination_slots AS s
    SET message_id = h.message_id
    FROM vacated AS v
    LEFT JOIN heirs AS h USING (destination, n)
    WHERE s.destination = v.destination AND s.slot = v.slot
      AND s.message_id IN (SELECT id FROM ending)
    RETURNING h.message_id AS seated
), unlisted AS (
    DELETE FROM {schema}.unseated_requests AS u
    WHERE u.message_id IN (SELECT id FROM ending)
       OR u.message_id IN (SELECT seated FROM freed)
)

-- fragment: destinations_due
-- The destinations a claim shares its batch across, with each one's room and
-- share (see "claim"): "alone", "destinations" and "listed".
alone AS (
    -- %(alone)s, the destination this dispatcher's last claim found alone, if it
    -- still is the only one with ready messages and is below its bound (two
    -- index probes): the claim then takes its first due messages, the whole
    -- batch, as they are read, without listing destinations and taking turns
    SELECT CAST(%(alone)s AS text) AS destination
    WHERE CAST(%(alone)s AS text) IS NOT NULL
      -- max() and min(), not EXISTS: with its parameters unknown, a plan
      -- could read the whole table for an EXISTS, never for these
      AND (SELECT max(m.destination) FROM {schema}.messages AS m
           WHERE m.state = 'ready' AND m.destination < %(alone)s) IS NULL
      AND (SELECT min(m.destination) FROM {schema}.messages AS m
           WHERE m.state = 'ready' AND m.destination > %(alone)s) IS NULL
      AND COALESCE((CAST(%(busy_counts)s AS integer[]))[
              array_position(CAST(%(busy)s AS text[]), CAST(%(alone)s AS text))], 0)
          < %(per_destination)s
      AND {health_alone}
), destinations AS (
    -- otherwise, the destinations with ready messages
    (SELECT m.destination
     FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND NOT EXISTS (SELECT 1 FROM alone)
     ORDER BY m.destination
     LIMIT 1)
    UNION ALL
    SELECT (SELECT m.destination
            FROM {schema}.messages AS m
            WHERE m.state = 'ready' AND m.destination > d.destination
            ORDER BY m.destination
            LIMIT 1)
    FROM destinations AS d
    WHERE d.destination IS NOT NULL
), {health_probes}, listed AS (
    -- each destination with its room: under the bound, or the whole batch for
    -- a destination below it and alone with ready messages (no other needs
    -- room then; at its bound, it gets no more even alone); and
    -- the share of the batch a destination gets in the first pass: as many turns
    -- as fill the batch when every destination has that many due
    SELECT d.destination,
           CASE WHEN probe.destination IS NOT NULL THEN 1
                WHEN count(*) OVER () = 1 AND COALESCE(busy.n, 0) < %(per_destination)s
                THEN %(limit)s
                ELSE GREATEST(0, LEAST(%(limit)s, %(per_destination)s - COALESCE(busy.n, 0)))
           END AS room,
           CAST(ceil(%(limit)s / CAST(count(*) OVER () AS numeric)) AS integer) AS share
    FROM destinations AS d
    LEFT JOIN unnest(CAST(%(busy)s AS text[]), CAST(%(busy_counts)s AS integer[]))
        AS busy(destination, n) ON busy.destination = d.destination
    {health_joins}
    WHERE d.destination IS NOT NULL  -- the row that ends the list
      AND {health_admitted}
)

-- fragment: retry_schedule
-- The retry schedule of a claimed message "c" whose endpoint is "e": the
-- endpoint's, else its event type's, else NULL for the dispatcher's default.
-- The event type's costs one primary key probe, made only for a webhook whose
-- endpoint has none (a plain message has no event type to look up).
CAST(COALESCE(e.retry_schedule,
              CASE WHEN c.event_type IS NOT NULL THEN
                  (SELECT t.retry_schedule FROM {schema}.event_types AS t
                   WHERE t.event_type = c.event_type)
              END) AS double precision[]) AS retry_schedule

-- fragment: claimed
-- The messages of "taken" (ids), now running under %(owner)s's lease, attempts + 1:
-- the fencing token every later write of this claim must match. By primary key,
-- from an array: joined to the CTE instead, the planner may hash the whole table
-- to find a batch of rows.
claimed AS (
    UPDATE {schema}.messages AS m
    SET state = 'running',
        lease_owner = %(owner)s,
        lease_until = now() + make_interval(secs => %(lease_s)s),
        attempts = m.attempts + 1
    WHERE m.id = ANY (ARRAY(SELECT id FROM taken))
    RETURNING m.id, m.idempotency_key, m.url, m.method, m.headers, m.body, m.content_type,
              m.attempts, m.max_attempts, m.endpoint_id, m.event_type, m.created_at,
              m.retry_base, m.available_at, m.ordering_key, m.destination, m.trace_context
)

-- fragment: no_job
-- A row of NULLs in the shape of "claimed_rows": a claim's signal that the
-- dispatcher must claim the rest another way (see "claim_uncapped", "claim_lone").
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL

-- fragment: claimed_rows
-- The rows a claim hands the dispatcher, read by column name in
-- dispatchers.delivery.jobs.job_rows: each claimed message with its endpoint's URL,
-- signing secrets and TLS material, its retry schedule, whether it is its
-- destination's probe, and no rate wait (the row without an id says that, see
-- "rate_wait").
SELECT c.id, c.idempotency_key, COALESCE(c.url, e.url) AS url,
       c.method, c.headers, c.body, c.content_type, c.attempts, c.max_attempts,
       c.endpoint_id, c.event_type, c.created_at, c.retry_base,
       s.secrets, s.secret_keys, c.ordering_key, c.destination, c.trace_context,
       e.ca_bundle, e.client_cert, e.client_key, e.client_key_id,
       {retry_schedule},
       c.destination IN (SELECT destination FROM probes) AS probe,
       CAST(NULL AS double precision) AS rate_wait_s
FROM claimed AS c
-- one primary key probe per claimed message: a plain join may be planned as a
-- hash of every endpoint (OFFSET 0 keeps the subquery apart, so it is not)
LEFT JOIN LATERAL (
    SELECT e.url, e.ca_bundle, e.client_cert, e.client_key, e.client_key_id, e.retry_schedule
    FROM {schema}.endpoints AS e
    WHERE e.id = c.endpoint_id
    OFFSET 0
) AS e ON true
-- the signing secrets still in force (several during a rotation), newest first,
-- as stored, with the ids of the keys that sealed them (NULL: plain text)
LEFT JOIN LATERAL (
    SELECT array_agg(s.secret ORDER BY s.id DESC) AS secrets,
           array_agg(s.key_id ORDER BY s.id DESC) AS secret_keys
    FROM {schema}.endpoint_secrets AS s
    WHERE s.endpoint_id = c.endpoint_id
      AND (s.expires_at IS NULL OR s.expires_at > now())
) AS s ON true

-- name: claim
-- Claim up to %(limit)s due messages for one dispatcher, shared fairly across
-- their destinations (an endpoint, or the origin of a plain message's URL), in
-- one statement that commits before any HTTP work starts.
--
-- A loose scan of the claimable index lists the destinations with ready
-- messages (one index probe each, whatever their backlogs); each contributes its
-- first due messages in (available_at, id) order, at most as many as it has room
-- for under the dispatcher's bound per destination (%(per_destination)s, less the
-- %(busy_counts)s it has in flight at the %(busy)s destinations; alone with
-- ready messages and below its bound, a destination has room for the whole
-- batch, as no other needs any), and first no more than an even share of the
-- batch, so that a claim reads about as many rows as it takes however many
-- destinations there are. They are taken in turns, every destination's first,
-- then every second, ..., so that a deep or slow backlog cannot hold another
-- destination's messages back. Told which destination the dispatcher's last
-- claim found alone (%(alone)s), and while that still holds, the claim skips
-- the list and the turns. SKIP LOCKED lets several dispatchers claim side by
-- side without waiting on each other. Which messages it may take is
-- "claimable", above. attempts + 1 is the fencing token every later write of
-- this claim must match. A destination with a policy (a rate limit, a cap) gets
-- no more than its allowance ("policy_room") and each of its messages takes a
-- slot of each kind it has ("policy_slots"); a last row without an id says when
-- the next rate slot frees ("rate_wait"). A destination that a Retry-After holds
-- or whose circuit breaker is open is passed over; once an open breaker's
-- back-off is over, one claim takes its probe, one message ("health_*").
WITH RECURSIVE {destinations_due}, {policy_room}, heads AS (
    -- the first pass: the first due messages of each destination, up to its share
    -- (and the allowance of a destination with a policy)
    SELECT l.destination, LEAST(l.room, p.allowance) AS room, l.share, h.id, h.available_at,
           row_number() OVER (PARTITION BY l.destination ORDER BY h.available_at, h.id) AS turn
    FROM listed AS l
    LEFT JOIN policed AS p USING (destination)
    CROSS JOIN LATERAL (
        SELECT m.id, m.available_at
        FROM {schema}.messages AS m
        WHERE m.destination = l.destination
          AND {claimable}
        ORDER BY m.available_at, m.id
        LIMIT LEAST(l.room, l.share, p.allowance)
    ) AS h
), more AS (
    -- the second pass, only when the first fell short of the batch (destinations
    -- with fewer due than their share, or none): the next messages of the
    -- destinations that filled their share, up to their room and the shortfall
    SELECT h.id, h.available_at,
           f.share + row_number() OVER (PARTITION BY f.destination
                                        ORDER BY h.available_at, h.id) AS turn
    FROM (SELECT destination, room, share
          FROM heads
          GROUP BY destination, room, share
          HAVING count(*) = share AND room > share) AS f
    CROSS JOIN LATERAL (
        SELECT m.id, m.available_at
        FROM {schema}.messages AS m
        WHERE m.destination = f.destination
          AND {claimable}
        ORDER BY m.available_at, m.id
        OFFSET f.share
        LIMIT LEAST(f.room - f.share, %(limit)s - (SELECT count(*) FROM heads))
    ) AS h
    WHERE (SELECT count(*) FROM heads) < %(limit)s
), lone AS (
    -- the alone destination's first due messages, locked as they are read
    SELECT m.id, m.endpoint_id, m.available_at, m.destination
    FROM {schema}.messages AS m
    WHERE m.destination = (SELECT destination FROM alone)
      AND {claimable}
    ORDER BY m.available_at, m.id
    LIMIT LEAST(%(limit)s, (SELECT allowance FROM policed
                            WHERE destination = (SELECT destination FROM alone)))
    FOR UPDATE OF m SKIP LOCKED
), turns AS (
    -- the others' messages, locked in turn order until the batch is full: the
    -- heads another claimer holds are skipped, and ones it claimed since our
    -- snapshot drop out on the re-check of their newest version. Locked here,
    -- not as the passes read them, so that no more than the batch is locked.
    -- By primary key, from an array: the planner cannot tell how few heads
    -- there are, and joined to them instead it may hash the whole table.
    SELECT m.id, m.endpoint_id, m.available_at, m.destination
    FROM unnest(ARRAY(SELECT id
                      FROM (SELECT id, turn, available_at FROM heads
                            UNION ALL
                            SELECT id, turn, available_at FROM more) AS taken
                      ORDER BY turn, available_at, id))
        WITH ORDINALITY AS h(id, n)
    JOIN {schema}.messages AS m ON m.id = h.id
    WHERE m.state = 'ready' AND m.available_at <= now()
    ORDER BY h.n
    LIMIT %(limit)s
    FOR UPDATE OF m SKIP LOCKED
), candidates AS (
    SELECT id, endpoint_id, available_at, destination FROM lone
    UNION ALL
    SELECT id, endpoint_id, available_at, destination FROM turns
), {policy_slots}, taken AS (
    SELECT id FROM admitted
), {claimed}, {health_probed}
({claimed_rows}
 ORDER BY c.available_at, c.id)
UNION ALL
{rate_wait}

-- name: claim_uncapped
-- "claim" for every message that needs no slot: a destination without a policy
-- ("unpoliced": without policies, the common case, that is every message "claim"
-- would take), as fair, in the same order, with the same result rows. Without
-- the slot machinery it costs half as much to plan, and less to run (the
-- dispatcher prepares both, once per server connection). When some destination
-- has a policy, its messages are passed over and one more row, all NULL, says
-- so: the caller then claims the rest with "claim".
WITH RECURSIVE {destinations_due}, heads AS (
    -- the first pass: the first due messages of each destination, up to its share
    SELECT l.destination, l.room, l.share, h.id, h.available_at,
           row_number() OVER (PARTITION BY l.destination ORDER BY h.available_at, h.id) AS turn
    FROM listed AS l
    CROSS JOIN LATERAL (
        SELECT m.id, m.available_at
        FROM {schema}.messages AS m
        WHERE m.destination = l.destination
          AND {claimable_uncapped}
        ORDER BY m.available_at, m.id
        LIMIT LEAST(l.room, l.share)
    ) AS h
), more AS (
    -- the second pass, only when the first fell short of the batch (destinations
    -- with fewer due than their share, or none): the next messages of the
    -- destinations that filled their share, up to their room and the shortfall
    SELECT h.id, h.available_at,
           f.share + row_number() OVER (PARTITION BY f.destination
                                        ORDER BY h.available_at, h.id) AS turn
    FROM (SELECT destination, room, share
          FROM heads
          GROUP BY destination, room, share
          HAVING count(*) = share AND room > share) AS f
    CROSS JOIN LATERAL (
        SELECT m.id, m.available_at
        FROM {schema}.messages AS m
        WHERE m.destination = f.destination
          AND {claimable_uncapped}
        ORDER BY m.available_at, m.id
        OFFSET f.share
        LIMIT LEAST(f.room - f.share, %(limit)s - (SELECT count(*) FROM heads))
    ) AS h
    WHERE (SELECT count(*) FROM heads) < %(limit)s
), lone AS (
    -- as in "claim"
    SELECT m.id, m.available_at
    FROM {schema}.messages AS m
    WHERE m.destination = (SELECT destination FROM alone)
      AND {claimable_uncapped}
    ORDER BY m.available_at, m.id
    LIMIT %(limit)s
    FOR UPDATE OF m SKIP LOCKED
), turns AS (
    -- as in "claim"
    SELECT m.id
    FROM unnest(ARRAY(SELECT id
                      FROM (SELECT id, turn, available_at FROM heads
                            UNION ALL
                            SELECT id, turn, available_at FROM more) AS taken
                      ORDER BY turn, available_at, id))
        WITH ORDINALITY AS h(id, n)
    JOIN {schema}.messages AS m ON m.id = h.id
    WHERE m.state = 'ready' AND m.available_at <= now()
    ORDER BY h.n
    LIMIT %(limit)s
    FOR UPDATE OF m SKIP LOCKED
), candidates AS (
    SELECT id FROM lone
    UNION ALL
    SELECT id FROM turns
), capped AS (
    {policed_exists}
), taken AS (
    SELECT id FROM candidates
), {claimed}, {health_probed}
({claimed_rows}
 ORDER BY c.available_at, c.id)
UNION ALL
{no_job}
FROM capped

-- name: claim_lone
-- "claim_uncapped" the short way, for the destination the dispatcher's last
-- claim found alone with ready messages (%(alone)s), while it still is and
-- takes no policy: its first due messages, locked as they are read from the
-- destination index, without listing destinations or taking turns. What the
-- general claim would take then, at a fraction of its cost (its plan sets up
-- every pass whatever runs). It takes nothing, and returns one row of NULLs,
-- when the general claim must decide instead: another destination has ready
-- messages (two index probes), a hold or a breaker is on this one, or it has a
-- policy (its messages need slots). The dispatcher leaves room under its bound
-- per destination before it asks.
WITH deferred AS (
    SELECT (SELECT max(m.destination) FROM {schema}.messages AS m
            WHERE m.state = 'ready' AND m.destination < %(alone)s) IS NOT NULL
        OR (SELECT min(m.destination) FROM {schema}.messages AS m
            WHERE m.state = 'ready' AND m.destination > %(alone)s) IS NOT NULL
        OR NOT {health_alone}
        OR EXISTS (SELECT 1 FROM {schema}.destination_policies AS p
                   WHERE p.destination = %(alone)s)
        OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                   WHERE e.id = CASE WHEN starts_with(%(alone)s, 'endpoint:')
                                     THEN CAST(substr(%(alone)s, 10) AS bigint) END
                     AND (e.max_concurrency IS NOT NULL OR e.rate_limit_per_s IS NOT NULL))
        AS deferred
), lone AS (
    SELECT m.id
    FROM {schema}.messages AS m
    WHERE m.destination = %(alone)s
      AND {claimable_uncapped}
      AND NOT (SELECT deferred FROM deferred)
    ORDER BY m.available_at, m.id
    LIMIT %(limit)s
    FOR UPDATE OF m SKIP LOCKED
), taken AS (
    SELECT id FROM lone
), {claimed}, probes AS (
    -- none: a destination with a breaker is the general claim's
    SELECT CAST(NULL AS text) AS destination WHERE false
)
({claimed_rows}
 ORDER BY c.available_at, c.id)
UNION ALL
{no_job}
FROM deferred
WHERE deferred

-- name: renew
-- One heartbeat for every lease a dispatcher holds. A row missing from the result
-- is a lost lease (rescued, re-claimed, or completed by someone else).
UPDATE {schema}.messages AS m
SET lease_until = now() + make_interval(secs => %(lease_s)s)
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(attempts)s AS integer[])) AS held(id, attempt)
-- one primary key lookup per lease, as in "complete": the state is a subquery so
-- that the plan cannot read the lease index instead, whole, as it would when
-- the statistics were taken on an idle outbox (nothing running, the index
-- thought empty) and the plan is kept while thousands of leases are held
WHERE m.id = held.id
  AND m.attempts = held.attempt
  AND m.lease_owner = %(owner)s
  AND m.state = (SELECT 'running')
RETURNING m.id

-- name: complete
-- Write a batch of outcomes in one statement. Every write is fenced by owner,
-- attempt number and state, so an owner whose lease expired (and whose message
-- was claimed again, even by itself) changes nothing. Delivered messages move to
-- the history table; the others go back to ready (with their delay), to dead, or
-- are released (unsent, the attempt refunded; one held with an error, such as a
-- destination the SSRF guard refused, records it as the last error). Attempt rows
-- are written only for fenced-in outcomes that sent a request. Returns the ids
-- whose outcome was applied.
WITH outcome AS (
    SELECT *
    FROM unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(endpoint_ids)s AS bigint[]),
        CAST(%(attempts)s AS integer[]),
        CAST(%(states)s AS text[]),
        CAST(%(delays)s AS double precision[]),
        CAST(%(sent)s AS boolean[]),
        CAST(%(statuses)s AS integer[]),
        CAST(%(outcomes)s AS text[]),
        CAST(%(error_classes)s AS text[]),
        CAST(%(errors)s AS text[]),
        CAST(%(started)s AS timestamptz[]),
        CAST(%(durations)s AS integer[]),
        CAST(%(excerpts)s AS text[])
    ) AS o(id, endpoint_id, attempt, state, delay_s, sent, status, outcome, error_class,
           error, started_at, duration_ms, excerpt)
), health AS (
    -- Endpoint health: per endpoint in this batch, did any attempt succeed, did
    -- any fail, did one answer 410 Gone.
    SELECT endpoint_id,
           bool_or(outcome = 'delivered') AS any_success,
           count(*) FILTER (WHERE sent AND outcome IN ('retry', 'failed', 'gone')) AS failures,
           bool_or(outcome = 'gone') AS gone
    FROM outcome
    WHERE endpoint_id IS NOT NULL
    GROUP BY endpoint_id
), endpoint_update AS (
    -- A success clears the failure streak; failures extend it. 410 Gone disables
    -- the endpoint at once; failing without a success for disable_after disables
    -- it too. Successes on a healthy endpoint skip the write (hot endpoints would
    -- otherwise serialise every flush on their row).
    UPDATE {schema}.endpoints AS e
    SET failure_streak = CASE WHEN h.any_success THEN 0 ELSE e.failure_streak + h.failures END,
        failing_since = CASE WHEN h.any_success THEN NULL
                             ELSE COALESCE(e.failing_since, now()) END,
        last_success_at = CASE WHEN h.any_success THEN now() ELSE e.last_success_at END,
        enabled = e.enabled AND NOT h.gone AND NOT (
            NOT h.any_success
            AND COALESCE(e.failing_since, now()) < now() - make_interval(secs => %(disable_after_s)s)),
        disabled_reason = CASE
            WHEN NOT e.enabled THEN e.disabled_reason
            WHEN h.gone THEN 'the endpoint answered 410 Gone'
            WHEN NOT h.any_success
                 AND COALESCE(e.failing_since, now()) < now() - make_interval(secs => %(disable_after_s)s)
                THEN 'every attempt failed since ' || to_char(e.failing_since, 'YYYY-MM-DD HH24:MI:SS TZ')
            END,
        disabled_at = CASE WHEN NOT e.enabled THEN e.disabled_at
                           WHEN h.gone OR (NOT h.any_success
                                AND COALESCE(e.failing_since, now())
                                    < now() - make_interval(secs => %(disable_after_s)s))
                           THEN now() END,
        updated_at = now()
    FROM health AS h
    -- by primary key, from an array, as in "claim": joined to "health" alone, the
    -- plan may read every endpoint into a hash at each flush
    WHERE e.id = ANY (ARRAY(SELECT endpoint_id FROM health))
      AND e.id = h.endpoint_id
      AND (h.gone OR NOT h.any_success OR NOT e.enabled OR e.failure_streak > 0
           OR e.last_success_at IS NULL OR e.last_success_at <= now() - interval '10 seconds')
    RETURNING e.id, e.enabled, e.disabled_at = now() AS newly_disabled, e.disabled_reason
), disabled AS (
    SELECT id FROM endpoint_update WHERE NOT enabled
), paused AS (
    -- Pause the waiting messages of endpoints disabled by this batch.
    UPDATE {schema}.messages AS m
    SET state = 'paused'
    FROM disabled
    WHERE m.endpoint_id = disabled.id AND m.state = 'ready'
), done AS (
    -- One primary key lookup per outcome. The state is compared with a
    -- sub-select, not a constant, so that the planner cannot walk the partial
    -- lease index instead (every running row of every dispatcher, for each
    -- outcome), as it does when its statistics say that nothing runs.
    DELETE FROM {schema}.messages AS m
    USING outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running') AND o.state = 'delivered'
    RETURNING m.*, o.status AS final_status
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts, final_status,
           created_at, now()
    FROM done
), updated AS (
    -- A webhook whose endpoint was deleted while it was in flight (the delete set
    -- its endpoint_id to NULL) is dead like the endpoint's waiting messages, never
    -- retried: it would go unsigned to the deleted endpoint's URL.
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN o.state = 'ready' AND m.endpoint_id IS NULL
                          AND starts_with(m.target, 'endpoint:') THEN 'dead'
                     WHEN o.state = 'ready' AND m.endpoint_id IN (SELECT id FROM disabled)
                     THEN 'paused' ELSE o.state END,
        attempts = CASE WHEN o.sent THEN m.attempts ELSE m.attempts - 1 END,
        available_at = CASE WHEN o.state = 'ready'
                            THEN now() + make_interval(secs => o.delay_s)
                            ELSE m.available_at END,
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN o.state = 'ready' AND m.endpoint_id IS NULL
                               AND starts_with(m.target, 'endpoint:') THEN 'endpoint deleted'
                          WHEN o.sent THEN o.error
                          -- held unsent (secrets unavailable, destination refused):
                          -- why, for "messages show"; a plain release keeps the last
                          ELSE COALESCE(o.error, m.last_error) END,
        last_status = CASE WHEN o.sent THEN o.status ELSE m.last_status END,
        completed_at = CASE WHEN o.state = 'dead'
                              OR (m.endpoint_id IS NULL AND starts_with(m.target, 'endpoint:'))
                            THEN now() END
    FROM outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running') AND o.state <> 'delivered'  -- as in done
    RETURNING m.id
), applied AS (
    SELECT id FROM done
    UNION ALL
    SELECT id FROM updated
), ending AS (
    SELECT id FROM applied
), {slots_passed}, recorded AS (
    INSERT INTO {schema}.attempts (
        message_id, attempt, owner, started_at, duration_ms, status, outcome,
        error_class, error, response_excerpt
    )
    SELECT o.id, o.attempt, %(owner)s, o.started_at, o.duration_ms, o.status, o.outcome,
           o.error_class, o.error, o.excerpt
    FROM outcome AS o
    JOIN applied USING (id)
    WHERE o.sent
)
SELECT id, NULL AS disabled_endpoint, NULL AS reason FROM applied
UNION ALL
SELECT NULL, id, disabled_reason FROM endpoint_update WHERE newly_disabled

-- name: complete_delivered
-- "complete" for the common batch, every outcome a sent success: no retry to
-- schedule, no message to kill, no endpoint to disable. It writes what
-- "complete" writes for such a batch, fenced the same way, with the same result
-- rows, and costs about half as much to plan and less to run.
WITH done AS (
    DELETE FROM {schema}.messages AS m
    USING unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(attempts)s AS integer[]),
        CAST(%(statuses)s AS integer[]),
        CAST(%(outcomes)s AS text[]),
        CAST(%(error_classes)s AS text[]),
        CAST(%(errors)s AS text[]),
        CAST(%(started)s AS timestamptz[]),
        CAST(%(durations)s AS integer[]),
        CAST(%(excerpts)s AS text[])
    ) AS o(id, attempt, status, outcome, error_class, error, started_at, duration_ms, excerpt)
    -- one primary key lookup per outcome, as in "complete"
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running')
    RETURNING m.*, o.status AS final_status, o.outcome, o.error_class, o.error,
              o.started_at, o.duration_ms, o.excerpt
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts, final_status,
           created_at, now()
    FROM done
), recorded AS (
    INSERT INTO {schema}.attempts (
        message_id, attempt, owner, started_at, duration_ms, status, outcome,
        error_class, error, response_excerpt
    )
    SELECT id, attempts, %(owner)s, started_at, duration_ms, final_status, outcome,
           error_class, error, excerpt
    FROM done
), endpoint_update AS (
    -- A success clears its endpoint's failure streak; a disabled endpoint stays
    -- disabled. Skipped on a healthy endpoint, as in "complete".
    UPDATE {schema}.endpoints AS e
    SET failure_streak = 0,
        failing_since = NULL,
        last_success_at = now(),
        disabled_reason = CASE WHEN NOT e.enabled THEN e.disabled_reason END,
        disabled_at = CASE WHEN NOT e.enabled THEN e.disabled_at END,
        updated_at = now()
    WHERE e.id = ANY (CAST(%(endpoint_ids)s AS bigint[]))
      AND (NOT e.enabled OR e.failure_streak > 0
           OR e.last_success_at IS NULL OR e.last_success_at <= now() - interval '10 seconds')
    RETURNING e.id, e.enabled
), paused AS (
    -- the waiting messages of an endpoint disabled meanwhile, as in "complete"
    UPDATE {schema}.messages
    SET state = 'paused'
    WHERE endpoint_id = ANY (ARRAY(SELECT id FROM endpoint_update WHERE NOT enabled))
      AND state = 'ready'
), ending AS (
    SELECT id FROM done
), {slots_passed}
SELECT id, NULL AS disabled_endpoint, NULL AS reason FROM done

-- name: recorded_attempts
-- Which of these sent outcomes an earlier try of the same write recorded: the
-- dispatcher asks after a write whose answer was lost and whose retry matched
-- nothing. A lease the rescuer took over has an attempt row too, but with the
-- outcome 'lease_expired', which no sent outcome has.
SELECT a.message_id
FROM unnest(
    CAST(%(ids)s AS bigint[]),
    CAST(%(attempts)s AS integer[]),
    CAST(%(outcomes)s AS text[])
) AS o(id, attempt, outcome)
JOIN {schema}.attempts AS a ON a.message_id = o.id AND a.attempt = o.attempt
WHERE a.owner = %(owner)s AND a.outcome = o.outcome

-- name: rescue
-- Return messages whose lease expired (their dispatcher died, froze or lost the
-- database) to ready, or to dead when their attempts are spent. Walks the lease
-- index; SKIP LOCKED keeps concurrent rescuers and completions out of each
-- other's way. The lost attempt is recorded against the owner that held it.
-- A webhook whose endpoint was deleted meanwhile is dead, as in complete.
WITH expired AS (
    SELECT id, lease_owner, attempts,
           endpoint_id IS NULL AND starts_with(target, 'endpoint:') AS orphaned
    FROM {schema}.messages
    WHERE state = 'running' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN m.attempts >= m.max_attempts OR expired.orphaned THEN 'dead'
                     ELSE 'ready' END,
        available_at = now(),
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN expired.orphaned THEN 'endpoint deleted'
                          ELSE 'lease expired: the dispatcher stopped renewing it' END,
        last_status = NULL,
        completed_at = CASE WHEN m.attempts >= m.max_attempts OR expired.orphaned
                            THEN now() END
    FROM expired
    WHERE m.id = expired.id
    RETURNING m.id, m.state
), recorded AS (
    INSERT INTO {schema}.attempts (message_id, attempt, owner, started_at, outcome, error_class, error)
    SELECT expired.id, expired.attempts, expired.lease_owner, now(), 'lease_expired',
           'lease_expired', 'lease expired: the dispatcher stopped renewing it'
    FROM expired
    JOIN rescued USING (id)
    -- informational only: never let a stray row stop the rescue of the rest
    ON CONFLICT (message_id, attempt) DO NOTHING
), ending AS (
    -- rescued messages, and any other that holds a slot or waits for one and is
    -- no longer running (ended by a statement that frees no slot). One primary
    -- key probe per row: a NOT EXISTS here may be planned as a hash of every
    -- running message, built at each rescue once any slot is held.
    SELECT id FROM rescued
    UNION
    SELECT s.message_id
    FROM {schema}.destination_slots AS s
    WHERE s.message_id IS NOT NULL
      AND (SELECT m.state FROM {schema}.messages AS m WHERE m.id = s.message_id)
          IS DISTINCT FROM 'running'
    UNION
    SELECT u.message_id
    FROM {schema}.unseated_requests AS u
    WHERE (SELECT m.state FROM {schema}.messages AS m WHERE m.id = u.message_id)
          IS DISTINCT FROM 'running'
), {slots_passed}
SELECT id, state FROM rescued

-- name: work_remaining
-- For --drain: is anything due now or in flight, and how much is scheduled later.
-- "Due" skips what claim skips: a ready webhook whose endpoint is disabled (one
-- committed after the disable paused the rest) waits, and must not keep a drain
-- from ever finishing; the messages of a destination that a hold or an open
-- breaker blocks count as scheduled later, as retries do.
SELECT
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND m.available_at <= now()
       AND (m.endpoint_id IS NULL OR EXISTS (
             SELECT 1 FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id AND e.enabled))
       AND NOT {destination_blocked})
        AS due,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'running') AS running,
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND (m.available_at > now() OR {destination_blocked}))
        AS scheduled

-- name: retention
-- Remove one bounded batch of history: delivered messages completed before the
-- retention period, with their attempt rows and idempotency keys (so the dedupe
-- window of a key is the retention period). Dead messages are kept until purged.
-- Also one batch of events published before the retention period (publish's
-- once-per-event record; its window is the retention period too). Returns both
-- counts, so that the caller goes on while either batch was full.
-- SKIP LOCKED lets every dispatcher run it without waiting on the others.
WITH old AS (
    SELECT id
    FROM {schema}.delivered
    WHERE completed_at < now() - make_interval(secs => %(retention_s)s)
    ORDER BY completed_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), removed AS (
    DELETE FROM {schema}.delivered AS d
    USING old
    WHERE d.id = old.id
    RETURNING d.id, d.target, d.idempotency_key
), keys AS (
    -- by the key's primary key: a history row keeps its target and key
    DELETE FROM {schema}.message_keys AS k
    USING removed
    WHERE k.target = removed.target
      AND k.idempotency_key = removed.idempotency_key
      AND k.message_id = removed.id
), attempt_rows AS (
    DELETE FROM {schema}.attempts AS a
    USING removed
    WHERE a.message_id = removed.id
), old_events AS (
    SELECT event_key
    FROM {schema}.events
    WHERE created_at < now() - make_interval(secs => %(retention_s)s)
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), events_removed AS (
    DELETE FROM {schema}.events AS e
    USING old_events
    WHERE e.event_key = old_events.event_key
    RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS history,
       (SELECT count(*) FROM events_removed) AS events

-- name: health_open
-- Open a destination's breaker (a dispatcher's recent outcomes with it said so,
-- see dispatchers.delivery.health), blocked for %(backoff_s)s, unless it is open or
-- probing already: another dispatcher opened it first, and its back-off stands.
-- A hold becomes an open breaker, blocked at least until the hold ends. Returns
-- the row only when this statement opened it.
INSERT INTO {schema}.destination_health AS dh (
    destination, state, blocked_until, opened_at, reason
)
VALUES (%(destination)s, 'open', now() + make_interval(secs => %(backoff_s)s), now(),
        %(reason)s)
ON CONFLICT (destination) DO UPDATE
SET state = 'open',
    blocked_until = GREATEST(dh.blocked_until, excluded.blocked_until),
    opened_at = now(),
    failed_probes = 0,
    reason = excluded.reason,
    updated_at = now()
WHERE dh.state = 'held'
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_hold
-- Hold a destination for %(hold_s)s (a 429 or 503 with Retry-After): no claim
-- takes its messages before then. Only ever lengthens what blocks it; an open
-- or probing breaker stays so. Returns the row when this statement lengthened it.
INSERT INTO {schema}.destination_health AS dh (destination, state, blocked_until, reason)
VALUES (%(destination)s, 'held', now() + make_interval(secs => %(hold_s)s), %(reason)s)
ON CONFLICT (destination) DO UPDATE
SET blocked_until = excluded.blocked_until,
    reason = CASE WHEN dh.state = 'held' THEN excluded.reason ELSE dh.reason END,
    updated_at = now()
WHERE dh.blocked_until < excluded.blocked_until
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_close
-- The probe %(owner)s took succeeded: the breaker closes and the destination's
-- messages are claimed again. Fenced by the probe's owner and state, so that a
-- probe whose lease passed (another one was taken since) changes nothing.
DELETE FROM {schema}.destination_health AS dh
WHERE dh.destination = %(destination)s AND dh.state = 'probing'
  AND dh.probe_owner = %(owner)s
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_unprobe
-- The probe %(owner)s took never reached the destination (the SSRF guard
-- refused it, the client could not send it, or our own code failed: see
-- dispatchers.delivery.health.is_counted), so it says nothing of the destination's
-- health: the breaker stays open, its probe free for the next claim at once,
-- and its count of failed probes unchanged. Fenced as "health_close".
UPDATE {schema}.destination_health AS dh
SET state = 'open',
    probe_owner = NULL,
    blocked_until = now(),
    updated_at = now()
WHERE dh.destination = %(destination)s AND dh.state = 'probing'
  AND dh.probe_owner = %(owner)s
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_reopen
-- The probe %(owner)s took failed: the breaker opens again, for a back-off that
-- doubles with each failed probe in a row, from %(backoff_s)s up to
-- %(backoff_max_s)s, and lasts at least %(hold_s)s (the Retry-After the probe
-- was answered with, or 0). Fenced as "health_close".
UPDATE {schema}.destination_health AS dh
SET state = 'open',
    probe_owner = NULL,
    failed_probes = dh.failed_probes + 1,
    blocked_until = now() + make_interval(secs => GREATEST(
        LEAST(%(backoff_s)s * power(2, LEAST(dh.failed_probes + 1, 30)), %(backoff_max_s)s),
        %(hold_s)s)),
    updated_at = now()
WHERE dh.destination = %(destination)s AND dh.state = 'probing'
  AND dh.probe_owner = %(owner)s
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: set_timeouts
-- Sent ahead of each statement, local to its transaction (dispatchers.store.postgres). JIT
-- off: the dispatcher's statements are short, and a JIT-enabled server (as
-- distributions and managed services ship PostgreSQL) would compile any whose
-- estimated cost passes jit_above_cost, for seconds at each execution; the
-- claim's generic plan estimates its LIMITs as a share of the table, so its cost
-- passes the thresholds once the backlog is a few hundred messages deep.
SELECT set_config('statement_timeout', %(outbox_statement_timeout)s, true),
       set_config('lock_timeout', %(outbox_lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(outbox_idle_timeout)s, true),
       set_config('jit', 'off', true)

-- name: set_timeouts_prepared
-- set_timeouts, plus how a prepared statement is planned (dispatchers.store.postgres): a
-- generic plan, once per connection; and the size of the hot table in pages,
-- which the plans depend on (dispatchers.store.postgres re-plans them as it grows).
SELECT set_config('statement_timeout', %(outbox_statement_timeout)s, true),
       set_config('lock_timeout', %(outbox_lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(outbox_idle_timeout)s, true),
       set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       pg_relation_size('{schema}.messages')
           / CAST(current_setting('block_size') AS integer) AS hot_pages

-- name: waker_session
-- The waker's session connection (dispatchers.runtime.waker, never pooled): its one
-- lock wait bounded by lock_timeout, every statement by statement_timeout, and
-- a vanished dispatcher noticed (its locks freed) by TCP keepalives.
SELECT set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('tcp_keepalives_idle', '10', false),
       set_config('tcp_keepalives_interval', '5', false),
       set_config('tcp_keepalives_count', '3', false)

-- name: waker_listen
LISTEN {channel}

-- name: waker_unlisten
UNLISTEN {channel}

-- name: waker_lock
-- Waits for the lock, at most lock_timeout.
SELECT pg_advisory_lock(%(class)s, %(object)s)

-- name: waker_try_lock
SELECT pg_try_advisory_lock(%(class)s, %(object)s)

-- name: waker_unlock
SELECT pg_advisory_unlock(%(class)s, %(object)s)

-- name: waker_unlock_all
SELECT pg_advisory_unlock_all()

-- name: preflight_schema
-- At start-up (dispatchers.store.preflight): does the schema exist, may this role use
-- it, and may it read the versions applied to it (NULL when the schema has no
-- schema_migrations table: never migrated). Tables are looked up only where the
-- role has USAGE on the schema: a lookup there without it is an error.
SELECT ns.oid IS NOT NULL AS schema_exists,
       COALESCE(ns.usable, false) AS usable,
       CASE WHEN ns.usable THEN has_table_privilege(
                to_regclass(quote_ident(%(schema)s) || '.schema_migrations'), 'SELECT')
       END AS versions_readable,
       current_user AS role
FROM (SELECT n.oid, has_schema_privilege(n.oid, 'USAGE') AS usable
      FROM (SELECT CAST(to_regnamespace(quote_ident(%(schema)s)) AS oid) AS oid) AS n) AS ns

-- name: preflight_privileges
-- At start-up, on a migrated schema: of the table privileges a dispatcher needs
-- (given in order: dispatchers.store.preflight takes them from outbox.roles, where they
-- are listed once, with why), those the current role lacks, one row each.
-- SELECT, INSERT and UPDATE may be granted on some columns only (outbox roles
-- grants the dispatcher UPDATE on the endpoints' health columns alone): any
-- column counts here, and a statement that needs another one fails when it runs.
SELECT needed.table_name, needed.privilege
FROM unnest(CAST(%(tables)s AS text[]), CAST(%(privileges)s AS text[]))
    WITH ORDINALITY AS needed(table_name, privilege, n)
CROSS JOIN LATERAL (
    SELECT to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(needed.table_name))
        AS oid
) AS tbl
WHERE NOT COALESCE(
    CASE WHEN needed.privilege = 'DELETE'
        THEN has_table_privilege(tbl.oid, needed.privilege)
        ELSE has_any_column_privilege(tbl.oid, needed.privilege)
    END, false)
ORDER BY needed.n

-- name: preflight_secret_keys
-- The keys that seal signing secrets still in force and client keys: a
-- dispatcher must hold each.
SELECT key_id
FROM {schema}.endpoint_secrets
WHERE key_id IS NOT NULL AND (expires_at IS NULL OR expires_at > now())
UNION
SELECT client_key_id
FROM {schema}.endpoints
WHERE client_key_id IS NOT NULL
ORDER BY key_id
