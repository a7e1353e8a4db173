-- 0032: the swap. delivered and attempts become tables partitioned by range of
-- completed_at and started_at; the tables they were become their first
-- partitions, delivered_legacy and attempts_legacy, (MINVALUE) .. (cutover),
-- without a row read or copied:
--
-- - the CHECK validated by 0031 proves the partition's bound, so ATTACH skips
--   its scan;
-- - the parents' indexes are those the old tables have (same columns, same
--   predicate), so ATTACH adopts each existing index instead of building one;
-- - the primary keys stay per partition: a unique index of a partitioned table
--   must hold its partition key, and (id) or (message_id, attempt) does not.
--   A unique parent index on (id, completed_at) would not match the old
--   table's primary key either, and attaching would build it, under a lock that
--   stops completions. So each partition gets its own primary key, from the
--   function that makes partitions (_history_partition_add). Ids stay unique
--   across partitions because a message's id moves to the history once, when
--   it is delivered (the messages table's primary key has it until then); an
--   attempt row is written once per (message, attempt) under the message's row
--   lock (complete and rescue are fenced on it).
--
-- An old table that is empty (a new schema, or an outbox that never delivered)
-- is dropped instead: its partitions start today.
--
-- After the swap, partitions of a day, from the cutover (or today) to three
-- days ahead, and a DEFAULT partition that takes any row no partition covers
-- (a dispatcher's maintenance that fell behind, a row written with an old
-- time): nothing is refused for want of a partition. The dispatchers make the
-- partitions ahead and drop those past the retention period from then on
-- (history_extend and history_drop below, run by
-- dispatchers.runtime.maintenance.Partitions, which say how).
--
-- Locks: renaming the old tables takes ACCESS EXCLUSIVE on both, which waits
-- for the statements reading them and makes those that come after wait; it is
-- asked for half a second at a time (_history_lock, 0030), so completions wait
-- at most that long per try. Once held, the rest is catalog work.
--
-- Privileges: the new parents get what each role held on the old tables
-- (table and column privileges), so that dispatchers and operators go on
-- working before `outbox roles` is applied again. A statement through a parent
-- is checked against the parent's privileges only; the partitions need none.

-- Every partition of delivered and attempts, with its bounds (NULL: MINVALUE
-- below, or the DEFAULT partition, which has neither). Read from the catalog,
-- which is the one record of them.
CREATE FUNCTION history_partitions()
RETURNS TABLE (parent text, partition text, lower timestamptz, upper timestamptz,
               is_default boolean)
LANGUAGE sql STABLE
AS $$
    SELECT p.relname::text, c.relname::text,
           CAST(substring(b.bound FROM 'FROM \(''([^'']*)''\)') AS timestamptz),
           CAST(substring(b.bound FROM 'TO \(''([^'']*)''\)') AS timestamptz),
           b.bound = 'DEFAULT'
    FROM pg_inherits AS i
    JOIN pg_class AS p ON p.oid = i.inhparent
    JOIN pg_class AS c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) AS b
    WHERE i.inhparent IN (CAST('delivered' AS regclass), CAST('attempts' AS regclass))
    ORDER BY 1, 3 NULLS FIRST
$$;

-- Make the partition of parent (delivered or attempts) for [lower, upper), with
-- its primary key; rows of that range already in the DEFAULT partition (which
-- would make the CREATE fail) are moved into it first. Returns its name:
-- <parent>_p<YYYYMMDD> in UTC, with _<HH> when it does not start at midnight.
CREATE FUNCTION _history_partition_add(parent text, lower timestamptz, upper timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_name text := parent || '_p' || to_char(lower AT TIME ZONE 'UTC', 'YYYYMMDD')
                   || CASE WHEN lower = date_trunc('day', lower, 'UTC') THEN ''
                           ELSE to_char(lower AT TIME ZONE 'UTC', '"_"HH24') END;
    v_key text := CASE parent WHEN 'delivered' THEN 'completed_at' ELSE 'started_at' END;
    v_pkey text := CASE parent WHEN 'delivered' THEN 'id' ELSE 'message_id, attempt' END;
    v_default text;
    v_stray boolean := false;
    -- named in full: the search path of a caller starts with pg_catalog
    v_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c
                      WHERE c.oid = CAST(parent AS regclass));
BEGIN
    SELECT h.partition INTO v_default
    FROM history_partitions() AS h
    WHERE h.parent = _history_partition_add.parent AND h.is_default;
    IF v_default IS NOT NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= $1 AND %I < $2)',
                       v_default, v_key, v_key)
            INTO v_stray USING lower, upper;
    END IF;
    IF v_stray THEN
        -- the rare path: held aside, then written back through the parent
        EXECUTE format('CREATE TEMPORARY TABLE _history_moving (LIKE %I) ON COMMIT DROP',
                       parent);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *)'
                       ' INSERT INTO _history_moving SELECT * FROM moved',
                       v_default, v_key, v_key)
            USING lower, upper;
    END IF;
    EXECUTE format('CREATE TABLE %s.%I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                   v_schema, v_name, parent, lower, upper);
    EXECUTE format('ALTER TABLE %s.%I ADD PRIMARY KEY (%s)', v_schema, v_name, v_pkey);
    IF v_stray THEN
        EXECUTE format('INSERT INTO %I SELECT * FROM _history_moving', parent);
        DROP TABLE _history_moving;
    END IF;
    RETURN v_name;
END
$$;

-- Make the partitions of delivered and attempts that are missing from the end
-- of the last one to `ahead` from now, each one `step` long (hour, day or week,
-- aligned on its boundary in UTC; the first after a change of step is shorter,
-- up to the next boundary), at most `most` of them. Returns the names of those
-- it made: as many as `most` says that more may be missing. Each partition made
-- costs some 30 ms of catalog work, during which the parent's lock is held, so
-- callers make a few per transaction and call again.
--
-- The dispatchers run it every retention interval, each of them: one at a time
-- takes the work (a transaction-scoped advisory lock, tried, not waited for),
-- the others return at once and find it done at their next round. The caller
-- bounds its lock waits with a short lock_timeout: making a partition takes
-- ACCESS EXCLUSIVE on the parent for a moment, and a wait behind a long reader
-- would hold every completion behind it; failing, it is tried again next round.
-- SECURITY DEFINER: making a partition needs to own the parent, and the
-- dispatcher's role only writes rows.
CREATE FUNCTION history_extend(ahead interval, step text DEFAULT 'day', most integer DEFAULT 4)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_parent text;
    v_lower timestamptz;
    v_upper timestamptz;
BEGIN
    IF step IS NULL OR step NOT IN ('hour', 'day', 'week') THEN
        RAISE EXCEPTION 'step must be hour, day or week, not %', step
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ahead IS NULL OR ahead < interval '0' THEN
        RAISE EXCEPTION 'ahead must be a positive interval' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('outbox.history ' || CAST('delivered' AS regclass)::oid, 0)) THEN
        RETURN;
    END IF;
    FOREACH v_parent IN ARRAY ARRAY['delivered', 'attempts'] LOOP
        SELECT max(h.upper) INTO v_lower
        FROM history_partitions() AS h WHERE h.parent = v_parent;
        v_lower := COALESCE(v_lower, date_trunc(step, now(), 'UTC'));
        WHILE v_lower < now() + ahead AND most > 0 LOOP
            v_upper := date_trunc(step, v_lower, 'UTC') + CAST('1 ' || step AS interval);
            RETURN NEXT _history_partition_add(v_parent, v_lower, v_upper);
            v_lower := v_upper;
            most := most - 1;
        END LOOP;
    END LOOP;
END
$$;

-- Drop partition, one of delivered's or attempts' (not the DEFAULT one) whose
-- whole range ended at least `retention` ago; any other name is left alone and
-- false returned. The caller removes the idempotency keys of a delivered
-- partition's rows first (message_keys is not partitioned: it guards the keys'
-- uniqueness with its primary key). SECURITY DEFINER as history_extend, and
-- bounded by the caller's lock_timeout as it is: DROP takes ACCESS EXCLUSIVE on
-- the parent for a moment.
CREATE FUNCTION history_drop(partition text, retention interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    IF retention IS NULL OR retention <= interval '0' THEN
        RAISE EXCEPTION 'retention must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM history_partitions() AS h
    WHERE h.partition = history_drop.partition AND NOT h.is_default
      AND h.upper <= now() - retention;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %s.%I',
                   (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c
                    WHERE c.oid = CAST('delivered' AS regclass)),
                   partition);
    RETURN true;
END
$$;

DO $migration$
DECLARE
    v_table text;
    v_key text;
    v_cutover timestamptz;
    v_index record;
    v_grant record;
    v_empty boolean;
BEGIN
    PERFORM _history_lock();  -- (0030)

    FOREACH v_table IN ARRAY ARRAY['delivered', 'attempts'] LOOP
        v_key := CASE v_table WHEN 'delivered' THEN 'completed_at' ELSE 'started_at' END;
        EXECUTE format('ALTER TABLE %I RENAME TO %I', v_table, v_table || '_legacy');
        -- the old names go to the parent's indexes, which adopt these
        FOR v_index IN
            SELECT i.relname AS name
            FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid
            WHERE x.indrelid = CAST(v_table || '_legacy' AS regclass)
        LOOP
            EXECUTE format('ALTER INDEX %I RENAME TO %I', v_index.name,
                           v_table || '_legacy' || substr(v_index.name, length(v_table) + 1));
        END LOOP;
        EXECUTE format('CREATE TABLE %I (LIKE %I) PARTITION BY RANGE (%I)',
                       v_table, v_table || '_legacy', v_key);
        -- the new parent holds what each role held on the old table
        FOR v_grant IN
            SELECT a.privilege_type, a.grantee, NULL AS attname
            FROM pg_class AS c, aclexplode(c.relacl) AS a
            WHERE c.oid = CAST(v_table || '_legacy' AS regclass) AND a.grantee <> c.relowner
            UNION ALL
            SELECT a.privilege_type, a.grantee, t.attname
            FROM pg_attribute AS t, aclexplode(t.attacl) AS a
            WHERE t.attrelid = CAST(v_table || '_legacy' AS regclass)
              AND t.attnum > 0 AND NOT t.attisdropped
        LOOP
            EXECUTE format('GRANT %s %s ON %I TO %s', v_grant.privilege_type,
                           CASE WHEN v_grant.attname IS NOT NULL
                                THEN format('(%I)', v_grant.attname) ELSE '' END,
                           v_table,
                           CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC'
                                -- a regrole's text is quoted as an identifier
                                ELSE CAST(CAST(v_grant.grantee AS regrole) AS text) END);
        END LOOP;
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', v_table || '_legacy')
            INTO v_empty;
        IF v_empty THEN
            EXECUTE format('DROP TABLE %I', v_table || '_legacy');
        END IF;
    END LOOP;

    -- the indexes the old tables had, but their primary keys (see above)
    CREATE INDEX delivered_completed_idx ON delivered (completed_at);
    CREATE INDEX delivered_endpoint_idx ON delivered (endpoint_id, completed_at)
        WHERE endpoint_id IS NOT NULL;
    CREATE INDEX delivered_key_idx ON delivered (idempotency_key);
    CREATE INDEX delivered_created_idx ON delivered (created_at);
    CREATE INDEX attempts_started_idx ON attempts (started_at);

    FOREACH v_table IN ARRAY ARRAY['delivered', 'attempts'] LOOP
        IF to_regclass(v_table || '_legacy') IS NOT NULL THEN
            v_cutover := (SELECT cutover FROM history_partitioning WHERE table_name = v_table);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                           v_table, v_table || '_legacy', v_cutover);
            -- the partition's bound says it now
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I',
                           v_table || '_legacy', v_table || '_cutover_check');
        END IF;
    END LOOP;
END
$migration$;

-- Days from the cutover (or today) to three days ahead; then the safety net.
SELECT count(*) FROM history_extend(interval '3 days', 'day', 100);
CREATE TABLE delivered_default PARTITION OF delivered DEFAULT;
ALTER TABLE delivered_default ADD PRIMARY KEY (id);
CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;
ALTER TABLE attempts_default ADD PRIMARY KEY (message_id, attempt);

DROP TABLE history_partitioning;
DROP FUNCTION _history_lock();

DO $migration$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('history_partitions', '_history_partition_add',
                            'history_extend', 'history_drop')
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', routine);
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                       routine, current_schema());
    END LOOP;
END
$migration$;
