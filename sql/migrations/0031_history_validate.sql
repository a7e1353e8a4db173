-- 0031: prove the cutover of 0030 on every existing row of delivered and
-- attempts. VALIDATE CONSTRAINT reads each table whole, but under SHARE UPDATE
-- EXCLUSIVE: completions, retention and readers go on during the scan.
--
-- Nothing here depends on how near the cutover is: every row is below it (the
-- constraint has bound new rows since 0030), and 0032 makes partitions from it
-- on, whenever it runs. Only the time between a stopped run and its resumption
-- matters (0030 says why).
ALTER TABLE delivered VALIDATE CONSTRAINT delivered_cutover_check;
ALTER TABLE attempts VALIDATE CONSTRAINT attempts_cutover_check;
