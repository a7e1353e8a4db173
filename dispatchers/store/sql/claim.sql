-- The dispatcher's claims (dispatchers.store.postgres): "claim", "claim_uncapped"
-- and "claim_lone", each one statement that takes a batch of due messages under
-- a lease and commits before any HTTP work starts.
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.
-- The fragments come first, each written once and included word for word as
-- "{name}" by the statements (and later fragments) of this file: the predicates
-- on a message, the destinations in line, their policies, and the rows handed
-- back. Each fragment ends its comment with what it is (a condition, CTEs, a
-- SELECT) and the CTEs its includer must define before it.

-- fragment: ordering_key_free
-- A message with an ordering key waits while an earlier message of the same key
-- is ready, running or paused, and while any other of the key is running: one
-- moved back from the history (a replay keeps its id) or retried from dead may
-- be earlier than one already sent. A dead one holds no successor back.
-- A condition on the message "m" (of messages); it needs no CTE.
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
-- A condition on the message "m"; it needs no CTE.
m.state = 'ready'
AND m.available_at <= now()
AND (m.endpoint_id IS NULL OR (
        SELECT e.enabled FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id))
AND {ordering_key_free}

-- fragment: unpoliced
-- A message of a destination without a policy: an endpoint without a cap or a
-- rate limit, or an origin without a row in destination_policies. One probe of
-- a primary key each, as in "claimable" (and not an EXISTS, for the same reason).
-- A condition on the message "m"; it needs no CTE.
(m.endpoint_id IS NULL OR (
    SELECT e.enabled AND e.max_concurrency IS NULL AND e.rate_limit_per_s IS NULL
    FROM {schema}.endpoints AS e WHERE e.id = m.endpoint_id))
AND (m.endpoint_id IS NOT NULL OR (
    SELECT p.destination FROM {schema}.destination_policies AS p
    WHERE p.destination = m.destination) IS NULL)

-- fragment: claimable_uncapped
-- A message "claim_uncapped" may take: as "claimable", of a destination without
-- a policy.
-- A condition on the message "m"; it needs no CTE.
m.state = 'ready'
AND m.available_at <= now()
AND {unpoliced}
AND {ordering_key_free}

-- fragment: health_alone
-- The alone destination takes the short way only while no health row blocks it
-- or owes a probe (a hold that has ended does neither): one primary key probe.
-- A condition on the parameter %(alone)s; it needs no CTE.
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
-- The CTE "probe_rows"; it needs the CTE "destinations" before it.
probe_rows AS (
    SELECT dh.destination
    FROM {schema}.destination_health AS dh
    WHERE dh.destination IN (SELECT destination FROM destinations)
      AND dh.state <> 'held' AND dh.blocked_until <= now()
    FOR UPDATE OF dh SKIP LOCKED
)

-- fragment: health_joins
-- Each listed destination's health row, if any, and whether this claim took its probe.
-- Two joins of the destination row "d"; they need the CTE "probe_rows"
-- ("health_probes").
LEFT JOIN {schema}.destination_health AS dh ON dh.destination = d.destination
LEFT JOIN probe_rows AS probe ON probe.destination = d.destination

-- fragment: health_admitted
-- A listed destination the claim may take from: no health row, a hold that has
-- ended, or a probe this claim may take (its room is then one message).
-- A condition on "dh" and "probe" of "health_joins", in the same query.
(dh.destination IS NULL OR (dh.state = 'held' AND dh.blocked_until <= now())
 OR probe.destination IS NOT NULL)

-- fragment: destinations_due
-- The destinations a claim shares its batch across, with each one's room and
-- share (see "claim"): "alone", "destinations" and "listed".
-- The CTEs "alone", "destinations", "probe_rows" ("health_probes") and
-- "listed", first in a WITH RECURSIVE ("destinations" is a loose index scan); it
-- needs no CTE.
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

-- fragment: policy_room
-- "policed": the destinations in line for a claim ("listed" and "alone") that
-- have rate slots or concurrency slots (destination_slots), each with how many
-- requests it may start now (its allowance): its free rate slots, its free
-- concurrency slots, the fewer, counted up to the batch. A count of rows read,
-- never trusted to grant anything: the slots are taken in "policy_slots",
-- locked and re-checked there.
-- The CTE "policed"; it needs the CTEs "listed" and "alone"
-- ("destinations_due").
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

-- fragment: policy_slots
-- The slots of the candidates of "policed" destinations: "admitted" is every
-- candidate that may go, those without a policy and those granted a slot of
-- each kind their destination has. Free slots are locked with SKIP LOCKED and
-- re-checked on their newest version (a rate slot another claimer took since
-- our snapshot has moved its next_at, a concurrency slot has its holder), then
-- handed out in claim order; a candidate left without one stays ready.
-- The CTEs "policy_candidates" to "admitted" (id, endpoint_id, available_at);
-- they need the CTEs "candidates" (id, endpoint_id, available_at, destination)
-- and "policed" ("policy_room").
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

-- fragment: rate_wait
-- A row without an id when a rate-limited destination was in line: in how many
-- seconds its next rate slot frees (one taken by this claim, or free and left,
-- a period from now), so that the dispatcher claims again then rather than at
-- its next poll (nothing notifies it when a slot frees).
-- A SELECT in the shape of "claimed_rows", for a UNION ALL; it needs the CTE
-- "policed" ("policy_room").
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CAST(EXTRACT(epoch FROM min(CASE WHEN s.next_at > now() THEN s.next_at
                                        ELSE now() + s.period END) - now())
            AS double precision)
FROM {schema}.rate_slots AS s
WHERE s.destination IN (SELECT destination FROM policed WHERE rated)
HAVING count(*) > 0

-- fragment: policed_exists
-- One row if some destination has a policy: an endpoint with a cap or a rate
-- limit, or a row in destination_policies ("claim_uncapped" passed over their
-- messages, which "claim" takes with their slots).
-- Two probes, each planned on its own: under one LIMIT, a plan may count on the
-- second table to answer and read every endpoint for the first.
-- A SELECT, which "claim_uncapped" makes a CTE of; it needs no CTE.
SELECT 1
WHERE EXISTS (SELECT 1 FROM {schema}.endpoints
              WHERE max_concurrency IS NOT NULL OR rate_limit_per_s IS NOT NULL)
   OR EXISTS (SELECT 1 FROM {schema}.destination_policies)

-- fragment: claimed
-- The messages of "taken" (ids), now running under %(owner)s's lease, attempts + 1:
-- the fencing token every later write of this claim must match. By primary key,
-- from an array: joined to the CTE instead, the planner may hash the whole table
-- to find a batch of rows.
-- The CTE "claimed"; it needs the CTE "taken" (id).
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

-- fragment: health_probed
-- The probes this claim took: the locked rows of "health_probes" whose
-- destination it claimed a message of, turned to 'probing' for a lease (a
-- destination with nothing this statement may take stays open, for the next).
-- The CTE "probes"; it needs the CTEs "probe_rows" ("health_probes") and
-- "claimed".
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

-- fragment: retry_schedule
-- The retry schedule of a claimed message "c" whose endpoint is "e": the
-- endpoint's, else its event type's, else NULL for the dispatcher's default.
-- The event type's costs one primary key probe, made only for a webhook whose
-- endpoint has none (a plain message has no event type to look up).
-- A column of "claimed_rows", on its "c" and "e"; it needs no CTE.
CAST(COALESCE(e.retry_schedule,
              CASE WHEN c.event_type IS NOT NULL THEN
                  (SELECT t.retry_schedule FROM {schema}.event_types AS t
                   WHERE t.event_type = c.event_type)
              END) AS double precision[]) AS retry_schedule

-- fragment: claimed_rows
-- The rows a claim hands the dispatcher, read by column name in
-- dispatchers.delivery.jobs.job_rows: each claimed message with its endpoint's URL,
-- signing secrets, TLS material and credentials, its retry schedule, whether it is its
-- destination's probe, and no rate wait (the row without an id says that, see
-- "rate_wait").
-- A SELECT; it needs the CTEs "claimed" and "probes" ("health_probed", or the
-- includer's own).
SELECT c.id, c.idempotency_key, COALESCE(c.url, e.url) AS url,
       c.method, c.headers, c.body, c.content_type, c.attempts, c.max_attempts,
       c.endpoint_id, c.event_type, c.created_at, c.retry_base,
       s.secrets, s.secret_keys, c.ordering_key, c.destination, c.trace_context,
       e.ca_bundle, e.client_cert, e.client_key, e.client_key_id,
       -- its credentials as stored (sealed, or plain text), read in the same probe
       e.auth, e.auth_key_id,
       {retry_schedule},
       c.destination IN (SELECT destination FROM probes) AS probe,
       CAST(NULL AS double precision) AS rate_wait_s
FROM claimed AS c
-- one primary key probe per claimed message: a plain join may be planned as a
-- hash of every endpoint (OFFSET 0 keeps the subquery apart, so it is not)
LEFT JOIN LATERAL (
    SELECT e.url, e.ca_bundle, e.client_cert, e.client_key, e.client_key_id, e.auth,
           e.auth_key_id, e.retry_schedule
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

-- fragment: no_job
-- A row of NULLs in the shape of "claimed_rows": a claim's signal that the
-- dispatcher must claim the rest another way (see "claim_uncapped", "claim_lone").
-- A SELECT list, the includer adds its FROM; it needs no CTE.
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL

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
