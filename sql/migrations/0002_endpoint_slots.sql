-- 0002: per-endpoint concurrency caps, enforced across every dispatcher process.
--
-- An endpoint with max_concurrency = N has N slot rows. Claiming a message of a
-- capped endpoint takes a free slot in the same statement (FOR UPDATE SKIP
-- LOCKED, re-checked on the row's newest version, so two claimers can never
-- take one slot); recording the outcome, releasing or rescuing the message frees
-- it. No count of running rows is ever trusted, so there is nothing to race.
CREATE TABLE endpoint_slots (
    endpoint_id  bigint  NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    slot         integer NOT NULL CHECK (slot > 0),
    -- the running message that holds the slot; NULL when the slot is free
    message_id   bigint,
    PRIMARY KEY (endpoint_id, slot)
);

CREATE UNIQUE INDEX endpoint_slots_holder_idx ON endpoint_slots (message_id)
    WHERE message_id IS NOT NULL;

CREATE INDEX endpoint_slots_free_idx ON endpoint_slots (endpoint_id)
    WHERE message_id IS NULL;
