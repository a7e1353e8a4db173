-- 0030: the history (delivered, attempts) becomes range-partitioned by time,
-- in three steps that never copy a row and never hold a lock that blocks
-- completions for longer than a moment (0030 prepare, 0031 validate, 0032 swap).
--
-- Why: retention deleted the history one row at a time, which at a thousand
-- deliveries a second is 86 million deletes a day, each writing WAL, dead
-- tuples and index churn beside the business's own writes. From 0032 on the
-- dispatcher drops whole partitions instead (dispatchers.runtime.maintenance).
--
-- How: the tables as they are become the first partition ("legacy"), bounded
-- above by a cutover C. A CHECK (key < C) proves that bound, so that attaching
-- the table as the partition (MINVALUE) .. (C) reads none of it. It is added NOT
-- VALID here (a brief ACCESS EXCLUSIVE lock, no scan), validated in 0031 (a scan
-- under SHARE UPDATE EXCLUSIVE, which lets reads and writes go on), and relied
-- upon in 0032. C is a day boundary two days ahead, in UTC: every row written
-- until the swap is below it, since completions and attempts are stamped now().
--
-- The CHECK binds new rows at once: a completion after C would fail it. The
-- three files run in one `outbox migrate`, seconds or minutes apart; a run
-- stopped after 0030 or 0031 must be resumed before C, or completions are
-- refused from C until it is.

-- The cutover of each table, read by 0031 and 0032 (0032 drops it: from then
-- on the partitions' bounds in the catalog are the record).
CREATE TABLE history_partitioning (
    table_name text        PRIMARY KEY CHECK (table_name IN ('delivered', 'attempts')),
    cutover    timestamptz NOT NULL
);

INSERT INTO history_partitioning (table_name, cutover)
SELECT t, date_trunc('day', now(), 'UTC') + interval '2 days'
FROM unnest(ARRAY['delivered', 'attempts']) AS t;

-- ACCESS EXCLUSIVE on both tables, for the changes of 0030 and 0032 to their
-- definitions: asked for with a lock_timeout of 500 ms (below deadlock_timeout,
-- so that a completion that holds one table and wants the other is never the
-- one cancelled), and asked again a second later, up to 120 times. While a
-- request waits, every completion waits behind it: half a second at most per
-- try, where the runner's own lock_timeout (60 s) would let a long reader of
-- the history stop completions for a minute. Dropped by 0032.
CREATE FUNCTION _history_lock() RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_tries integer := 0;
    v_timeout text := current_setting('lock_timeout');
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '500ms', true);
            LOCK TABLE delivered, attempts IN ACCESS EXCLUSIVE MODE;
            EXIT;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            v_tries := v_tries + 1;
            IF v_tries >= 120 THEN
                RAISE EXCEPTION 'delivered and attempts stayed locked by other sessions'
                    ' for two minutes: run outbox migrate again when they are not';
            END IF;
            PERFORM pg_sleep(1);
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_timeout, true);
END
$$;

DO $migration$
DECLARE
    v_cutover timestamptz := (SELECT cutover FROM history_partitioning
                              WHERE table_name = 'delivered');
BEGIN
    PERFORM _history_lock();
    EXECUTE format('ALTER TABLE delivered ADD CONSTRAINT delivered_cutover_check'
                   ' CHECK (completed_at < %L) NOT VALID', v_cutover);
    EXECUTE format('ALTER TABLE attempts ADD CONSTRAINT attempts_cutover_check'
                   ' CHECK (started_at < %L) NOT VALID', v_cutover);
END
$migration$;
