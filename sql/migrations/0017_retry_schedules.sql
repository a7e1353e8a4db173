-- 0017: retry schedules chosen per endpoint and per event type.
--
-- A schedule is the list of delays, in seconds, before each retry (the last one
-- repeats until the message's attempts are spent). An endpoint's schedule is a
-- column of its row, which the claim reads already; an event type's lives in
-- event_types, written by operators and read by the claim with one primary key
-- probe per claimed webhook whose endpoint has none. NULL: the dispatcher's
-- default schedule.
--
-- The rule is a domain, as in 0005: endpoints is updated by every completion
-- that records a failure, and a table CHECK would be planned for each of them.
-- At most 100 delays, each above 0 and at most a week (the longest delay the
-- dispatcher writes); NaN is greater than every number, so it fails the bound.
CREATE DOMAIN retry_schedule AS double precision[]
    CONSTRAINT retry_schedule_check CHECK (
        array_ndims(VALUE) = 1
        AND cardinality(VALUE) BETWEEN 1 AND 100
        AND array_position(VALUE, NULL) IS NULL
        AND 0 < ALL (VALUE)
        AND 604800 >= ALL (VALUE));

ALTER TABLE endpoints ADD COLUMN retry_schedule retry_schedule;

CREATE TABLE event_types (
    event_type text PRIMARY KEY,
    retry_schedule retry_schedule NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
