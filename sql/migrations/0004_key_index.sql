-- 0004: one index fewer on every enqueue.
--
-- message_keys had a unique index on message_id besides its primary key on
-- (target, idempotency_key). Only retention looked keys up by message_id, and it
-- can find them by the primary key instead: a history row keeps its target and
-- key. Ids come from the messages sequence, so they stay unique without an index.
-- Every enqueue and publish wrote an entry into that index; without it the outbox
-- row writes about 8% less WAL.
ALTER TABLE message_keys DROP CONSTRAINT message_keys_message_id_key;
