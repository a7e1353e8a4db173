-- 0014: no schema change.
SELECT 1;
