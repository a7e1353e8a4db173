-- 0021: a request in flight to a capped destination counts against its cap even
-- when it holds no slot.
--
-- A capped destination has one slot row per unit of its cap (0014), and a
-- request holds one while in flight, so that its free slots are the cap less the
-- requests in flight. Two kinds of request held none: one claimed before the
-- destination had a cap, and the holder of a slot that a lowered cap removed
-- when no free slot was left to move it to. Neither was counted: a slot freed or
-- added meanwhile let a claim start with the cap's worth already in flight.
--
-- Such a request is now listed here (by "slots_synced" in slots.sql, when the cap
-- is set or changed), and the next slot of its destination to free up passes to
-- it instead of being freed ("slots_passed" in dispatch.sql: complete, rescue).
-- Its row goes when it is seated or its request ends. The claim needs no change:
-- its free slots are again the cap less the requests in flight.
--
-- What a completion pays when nothing is listed: one probe of an empty index.
CREATE TABLE unseated_requests (
    -- a running message of a capped destination that holds no slot
    message_id   bigint PRIMARY KEY,
    destination  text   NOT NULL
);

CREATE INDEX unseated_requests_destination_idx ON unseated_requests (destination, message_id);

-- Requests already in flight without a slot: the holders of slots a lowered cap
-- removed before this migration.
INSERT INTO unseated_requests (message_id, destination)
SELECT m.id, m.destination
FROM messages AS m
WHERE m.state = 'running'
  AND EXISTS (SELECT 1 FROM destination_slots AS s WHERE s.destination = m.destination)
  AND NOT EXISTS (SELECT 1 FROM destination_slots AS s WHERE s.message_id = m.id);
