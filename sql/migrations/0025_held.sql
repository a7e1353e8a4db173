-- 0025: held for the migration of another branch (the management API, branch api),
-- which takes this number when it is merged. Until then this file keeps the
-- versions without a gap (outbox.migrations refuses one); it changes nothing,
-- and the merge replaces it.
SELECT 1;
