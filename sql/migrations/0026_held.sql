-- 0026: held for the migration of another branch (the consumer portal's links, branch portal),
-- which takes this number when it is merged. Until then this file keeps the
-- versions without a gap (outbox.migrations refuses one); it changes nothing,
-- and the merge replaces it.
SELECT 1;
