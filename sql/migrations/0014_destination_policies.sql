-- 0014: a cap and a rate limit per destination, endpoints' and origins' alike,
-- enforced across every dispatcher process.
--
-- A policy names a plain destination (the origin "scheme://host:port" of a plain
-- message's URL, as messages.destination holds it) with a cap on its requests in
-- flight, a rate limit, or both. An endpoint keeps its own in its row:
-- max_concurrency, and rate_limit_per_s (unused before) with rate_burst, here.
--
-- Both are enforced by slot rows keyed by destination ("endpoint:<id>" for an
-- endpoint), one mechanism for both kinds of destination. Caps: endpoint_slots
-- (0002) becomes destination_slots, its rows moved over; a capped destination
-- has max_concurrency rows, and the claim takes a free one per message (FOR
-- UPDATE SKIP LOCKED, re-checked on its newest version), completion, release and
-- rescue free it. No count of running rows is trusted.
--
-- Rate limits are slots too. A destination limited to R requests per second with
-- a burst of B has B rows in rate_slots, each usable once every B / R seconds
-- (its "period"): the claim takes the slots whose next_at has passed, in the same
-- way, and moves each one's next_at to now() + period. So at most B requests
-- start in any window of B / R seconds, R per second over time, exactly, however
-- many dispatchers claim, and the first B requests go at once (the burst). A slot
-- is never given back: a request counts against the limit once it is claimed,
-- whatever comes of it.
--
-- Chosen over a token bucket (one row per destination, its tokens refilled from
-- the time elapsed and taken in the claim): every claim of a limited destination
-- would update that one row, so concurrent claimers would queue on its lock (or,
-- skipping it, claim nothing there), and the refill arithmetic would have to be
-- repeated in every statement that reads the bucket. With slots, claimers take
-- different rows side by side, a slot is free or not by one comparison, and the
-- claim reads how many requests a destination may start now as a count of rows.
-- Measured, a claim of 100 messages of one destination (5,000 ready), rolled
-- back each time: 2.6 ms without a policy; 5.2 ms with a rate limit (burst 100)
-- and a cap, which take 100 rows of each kind; 3.3 ms for the claim with slots
-- with no policy to apply. Slots are locked one per candidate, no more.
--
-- The periods are stored with the slots (written when a policy is set), so the
-- claim need not read the policy to move next_at. An outbox with no policy pays
-- one probe of the policies table's primary key per plain message its claim
-- (claim_uncapped) considers; the claim with slots runs only once a policy exists.
CREATE TABLE destination_policies (
    destination       text PRIMARY KEY,
    max_concurrency   concurrency_cap,
    rate_limit_per_s  rate_limit,
    -- requests that may start at once after an idle spell; set with the limit
    rate_burst        slot_number,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (max_concurrency IS NOT NULL OR rate_limit_per_s IS NOT NULL),
    CHECK ((rate_limit_per_s IS NULL) = (rate_burst IS NULL))
);

ALTER TABLE endpoints ADD COLUMN rate_burst slot_number;

CREATE TABLE destination_slots (
    -- a plain destination's origin, or "endpoint:<id>"
    destination  text        NOT NULL,
    slot         slot_number NOT NULL,
    -- the running message that holds the slot; NULL when the slot is free
    message_id   bigint,
    PRIMARY KEY (destination, slot)
);

CREATE UNIQUE INDEX destination_slots_holder_idx ON destination_slots (message_id)
    WHERE message_id IS NOT NULL;

CREATE INDEX destination_slots_free_idx ON destination_slots (destination, slot)
    WHERE message_id IS NULL;

INSERT INTO destination_slots (destination, slot, message_id)
SELECT 'endpoint:' || endpoint_id, slot, message_id
FROM endpoint_slots;

DROP TABLE endpoint_slots;

CREATE TABLE rate_slots (
    -- a plain destination's origin, or "endpoint:<id>"
    destination  text        NOT NULL,
    slot         slot_number NOT NULL,
    period       interval    NOT NULL,
    next_at      timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (destination, slot)
);

-- An endpoint whose rate_limit_per_s was set before it was enforced gets the
-- default burst (outbox.defaults.default_burst: about a second's worth of
-- requests, from 1 to 10) and its slots.
UPDATE endpoints
SET rate_burst = LEAST(10, GREATEST(1, CAST(ceil(rate_limit_per_s) AS integer)))
WHERE rate_limit_per_s IS NOT NULL;

INSERT INTO rate_slots (destination, slot, period)
SELECT 'endpoint:' || e.id, g, make_interval(secs => e.rate_burst / e.rate_limit_per_s)
FROM endpoints AS e
CROSS JOIN LATERAL generate_series(1, e.rate_burst) AS g
WHERE e.rate_limit_per_s IS NOT NULL;
