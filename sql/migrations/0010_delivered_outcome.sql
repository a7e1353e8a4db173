-- 0010: one word for a delivered message.
--
-- Attempts that delivered were recorded with the outcome 'succeeded' while the
-- message's state, `outbox status`, the metrics and the README all said
-- 'delivered'. The dispatcher now records 'delivered'; this renames the
-- attempts recorded before, so that `messages show`, the dashboard and `status`
-- read one word for every attempt. The attempts table holds the retention
-- period's attempts (7 days by default); the update touches only the rows that
-- carry the old word.
UPDATE attempts SET outcome = 'delivered' WHERE outcome = 'succeeded';
