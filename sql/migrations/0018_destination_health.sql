-- 0018: what the dispatchers know of a destination's health, shared by all of them.
--
-- A destination (messages.destination: "endpoint:<id>", or the origin of a plain
-- message's URL) has a row here only while claims must pass it over or treat it
-- specially; a healthy outbox has none, and the claim then costs what it cost
-- before (one primary key probe per destination it lists, on an empty table).
--
-- - 'held': a 429 or 503 came with Retry-After; no claim takes the destination's
--   messages before blocked_until (their attempts are not spent). The row stays
--   after the hold ends, harmless, until the destination's next transition.
-- - 'open': the circuit breaker is open (the destination failed most of its
--   recent attempts); no claim takes its messages before blocked_until, and then
--   exactly one claim takes one probe: it turns the row to 'probing' under its
--   row lock, so that two claimers cannot both take it.
-- - 'probing': one probe request is out (probe_owner sent it); its messages wait
--   until the probe's outcome closes the breaker (the row is deleted) or opens it
--   again (failed_probes + 1, a longer blocked_until). Should its dispatcher die,
--   blocked_until (now plus a lease) passes and another claim takes a probe.
--
-- Dispatchers write a row on a transition only, never per outcome: each keeps
-- its own recent outcomes per destination in memory (dispatchers.delivery.health, ten
-- buckets of counts per destination, about half a microsecond per outcome) and
-- opens the breaker when its window says so; a hold is written once per
-- Retry-After answer that lengthens it by a second or more. So a completion
-- batch writes nothing here. Counting outcomes in this row instead (one update
-- per destination per flushed batch) would have every dispatcher's flush
-- update the same row of a busy destination, each waiting for the other's
-- commit, and would cost a write per batch in steady traffic; the price of
-- counting in memory is that each dispatcher judges from its own attempts.
-- The claim reads this table by its primary key only. With no rows, a claim of
-- 100 messages across 100 destinations took about 0.1 ms more to execute (1.8
-- ms instead of 1.7) and 0.3 ms more as the client timed its round trip (its
-- plan is larger); drain-http, end to end, did not change beyond its noise.
CREATE TABLE destination_health (
    destination    text        PRIMARY KEY,
    state          text        NOT NULL CHECK (state IN ('held', 'open', 'probing')),
    blocked_until  timestamptz NOT NULL,
    failed_probes  integer     NOT NULL DEFAULT 0 CHECK (failed_probes >= 0),
    probe_owner    text,
    opened_at      timestamptz,
    reason         text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'probing') = (probe_owner IS NOT NULL)),
    CHECK ((state = 'held') = (opened_at IS NULL))
);
