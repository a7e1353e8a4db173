-- 0033: idempotency keys and event records by generation. message_keys and
-- events are what make enqueue and publish idempotent; until now retention
-- deleted them row by row with their history, some 10,000 keys a second: at
-- scale, hours of deletes and vacuum a day. From here each is a pair of plain
-- tables, the current generation (message_keys, events), where producers
-- write, and the previous one (message_keys_old, events_old), which they only
-- read. Every --retention, the dispatchers' maintenance turns the generation:
-- the previous tables are dropped whole, the current ones become the previous
-- ones, and new empty ones are made current (key_generation_turn). A day of
-- keys goes in a catalog change, with no delete, no WAL of rows and no bloat.
--
-- Uniqueness across the pair. A producer looks its key up in the previous
-- table and inserts it into the current one with ON CONFLICT, whose primary
-- key decides a race between two producers, as it always did. That is safe
-- because of the order in which PostgreSQL does things: a statement locks the
-- tables it names before it takes its snapshot (READ COMMITTED takes one per
-- statement, after planning or revalidating a cached plan). The turn renames
-- the tables under ACCESS EXCLUSIVE, which waits until every transaction that
-- wrote to the current table has ended; a producer's statement that comes
-- during or after the turn waits for it, is planned again against the new
-- tables (names are looked up again), and takes its snapshot after the turn
-- committed, so the table it reads as previous holds every key committed in
-- it. Under REPEATABLE READ or SERIALIZABLE the snapshot is the transaction's,
-- which may predate a turn: _keys_moved raises serialization_failure then,
-- and the transaction is retried instead of missing a key.
--
-- The turn waits for its locks half a second at most (the caller's
-- lock_timeout) and is tried again at the next round: producers wait behind it
-- at most that long, once per generation.
--
-- Lifetimes. A key lives at least --retention after its message leaves the
-- messages table (delivered, or a dead one purged), and an event's record at
-- least --retention after it was published; both at most about twice that.
-- After a turn, key_generation_carry copies the keys of the messages still in
-- messages (ready, running, paused, dead) from the previous table into the
-- current one, in batches, and records when it was done (carried_at); the next
-- turn comes no sooner than --retention after that. So a key that was not
-- carried belongs to a message that had left before carried_at, at least
-- --retention before its table is dropped. Events are not carried: a record is
-- written in the current generation, which lasts at least --retention more.
--
-- Old producers (a library from before this migration, during a rolling
-- upgrade) write into message_keys and events as before, and see only the
-- current generation: the first turn comes --retention after this migration,
-- time enough to upgrade them. Old dispatchers go on deleting keys and events
-- with their history; the new ones drop them with their generation.
--
-- events_created_idx goes: it served only the deletion of old events.

DROP INDEX events_created_idx;

-- The state of the generations: one row. keys: the current message_keys (its
-- oid), which _keys_moved compares with the one a name resolves to now.
-- carry_until: the highest message id drawn before the turn (a message above
-- it has its key in the current table); carry_after: how far the carry went.
CREATE TABLE key_generation (
    one          boolean     PRIMARY KEY DEFAULT true CHECK (one),
    generation   integer     NOT NULL,
    turned_at    timestamptz NOT NULL,
    keys         oid         NOT NULL,
    carry_after  bigint      NOT NULL DEFAULT 0,
    carry_until  bigint      NOT NULL DEFAULT 0,
    carried_at   timestamptz
);

-- Give table `target` the privileges (table and column) that table `source`
-- holds, for each role but the owner.
CREATE FUNCTION _grants_copy(source regclass, target regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN
        SELECT a.privilege_type, a.grantee, NULL AS attname
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = source AND a.grantee <> c.relowner
        UNION ALL
        SELECT a.privilege_type, a.grantee, t.attname
        FROM pg_attribute AS t, aclexplode(t.attacl) AS a
        WHERE t.attrelid = source AND t.attnum > 0 AND NOT t.attisdropped
    LOOP
        EXECUTE format('GRANT %s %s ON %s TO %s', v_grant.privilege_type,
                       CASE WHEN v_grant.attname IS NOT NULL
                            THEN format('(%I)', v_grant.attname) ELSE '' END,
                       target,
                       CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC'
                            ELSE CAST(CAST(v_grant.grantee AS regrole) AS text) END);
    END LOOP;
END
$$;

-- The previous generation of each, empty: the tables as they are hold every
-- key and event so far, and become the previous ones at the first turn.
CREATE TABLE message_keys_old (LIKE message_keys INCLUDING ALL);
CREATE TABLE events_old (LIKE events INCLUDING ALL);
SELECT _grants_copy('message_keys', 'message_keys_old'), _grants_copy('events', 'events_old');

INSERT INTO key_generation (generation, turned_at, keys, carried_at)
VALUES (1, now(), CAST('message_keys' AS regclass), now());

-- Under REPEATABLE READ or SERIALIZABLE, raise serialization_failure when the
-- generation turned since the transaction's snapshot (its key_generation row
-- names another table than message_keys is now): the snapshot may then miss
-- keys that the previous table holds; else return false. Producers call it
-- only under those levels, before they write a key or an event (READ
-- COMMITTED needs no check, see the top of this file); it runs as its caller,
-- who reads key_generation, with the search path pinned below.
CREATE FUNCTION _keys_moved() RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF (SELECT g.keys FROM key_generation AS g)
       IS DISTINCT FROM CAST(to_regclass('message_keys') AS oid) THEN
        RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE =
            'the generation of idempotency keys turned since this transaction''s '
            'snapshot; try the transaction again';
    END IF;
    RETURN false;
END
$$;

-- Turn the generation if the carry into the current one was done at least
-- `retention` ago: drop the previous tables, make the current ones previous
-- and new empty ones current, with the same privileges; return the new
-- generation, or NULL when it is not due or another dispatcher is turning it.
-- The caller bounds the lock waits with a short lock_timeout; failing, it
-- tries again at its next round. SECURITY DEFINER: dropping and renaming
-- tables needs to own them, and the dispatcher's role only writes rows.
CREATE FUNCTION key_generation_turn(retention interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_generation key_generation;
    v_table text;
    -- named in full: the search path of these functions starts with pg_catalog
    v_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c
                      WHERE c.oid = CAST('key_generation' AS regclass));
BEGIN
    IF retention IS NULL OR retention <= interval '0' THEN
        RAISE EXCEPTION 'retention must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_generation FROM key_generation FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR v_generation.carried_at IS NULL
       OR v_generation.carried_at > now() - retention THEN
        RETURN NULL;
    END IF;
    LOCK TABLE message_keys, message_keys_old, events, events_old IN ACCESS EXCLUSIVE MODE;
    FOREACH v_table IN ARRAY ARRAY['message_keys', 'events'] LOOP
        EXECUTE format('DROP TABLE %s.%I', v_schema, v_table || '_old');
        EXECUTE format('ALTER INDEX %s.%I RENAME TO %I', v_schema, v_table || '_pkey',
                       v_table || '_old_pkey');
        EXECUTE format('ALTER TABLE %s.%I RENAME TO %I', v_schema, v_table, v_table || '_old');
        EXECUTE format('CREATE TABLE %s.%I (LIKE %s.%I INCLUDING ALL)', v_schema, v_table,
                       v_schema, v_table || '_old');
        PERFORM _grants_copy(CAST(format('%s.%I', v_schema, v_table || '_old') AS regclass),
                             CAST(format('%s.%I', v_schema, v_table) AS regclass));
    END LOOP;
    UPDATE key_generation
    SET generation = generation + 1, turned_at = now(),
        keys = CAST(format('%s.message_keys', v_schema) AS regclass),
        carry_after = 0,
        carry_until = (SELECT s.last_value FROM messages_id_seq AS s),
        carried_at = NULL
    RETURNING generation INTO v_generation.generation;
    RETURN v_generation.generation;
END
$$;

-- After a turn: copy the keys of up to `batch` messages still in messages, the
-- next ones by id up to carry_until, from the previous table into the current
-- one; when none is left, record carried_at. Returns the messages read, or
-- NULL when there is nothing to carry (or another dispatcher is carrying).
-- Every key of the previous table was committed before the turn (it waited for
-- them), and a key copied names the same message, so producers need not wait
-- for it; carried_at is read after the last copy, so that a message not copied
-- had left messages before it.
CREATE FUNCTION key_generation_carry(batch integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_generation key_generation;
    v_read integer;
    v_last bigint;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_generation FROM key_generation FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR v_generation.carried_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    WITH chosen AS (
        SELECT m.id, m.target, m.idempotency_key
        FROM messages AS m
        WHERE m.id > v_generation.carry_after AND m.id <= v_generation.carry_until
        ORDER BY m.id
        LIMIT batch
    ), copied AS (
        INSERT INTO message_keys (target, idempotency_key, message_id, created_at, digest)
        SELECT k.target, k.idempotency_key, k.message_id, k.created_at, k.digest
        FROM chosen AS c
        JOIN message_keys_old AS k
          ON k.target = c.target AND k.idempotency_key = c.idempotency_key
         AND k.message_id = c.id
        ON CONFLICT (target, idempotency_key) DO NOTHING
    )
    SELECT count(*), max(id) INTO v_read, v_last FROM chosen;
    UPDATE key_generation
    SET carry_after = COALESCE(v_last, carry_until),
        carried_at = CASE WHEN v_read < batch THEN clock_timestamp() END;
    RETURN v_read;
END
$$;

-- The producers of 0022 and 0028 (enqueue, publish, _fan_out), changed where
-- they read or write keys and events: a key or an event of the previous
-- generation is found there, and nothing is written for it. Each change is an
-- exact replacement in the function's definition; one that finds nothing to
-- replace fails the migration.
DO $migration$
DECLARE
    v_edit record;
    v_text text;
BEGIN
    FOR v_edit IN
        SELECT CAST(e.routine AS regprocedure) AS routine, e.old, e.new
        FROM (VALUES
            ('enqueue(text,text,jsonb,bytea,text,text,jsonb,text,timestamptz,integer,text,text,boolean)',
             $old$    VALUES (enqueue.url, enqueue.idempotency_key, v_id, v_digest)
$old$,
             $new$    SELECT enqueue.url, enqueue.idempotency_key, v_id, v_digest
    WHERE (pg_catalog.current_setting('transaction_isolation') = 'read committed'
           OR NOT _keys_moved())
      AND NOT EXISTS (SELECT FROM message_keys_old AS k
                      WHERE k.target = enqueue.url
                        AND k.idempotency_key = enqueue.idempotency_key)
$new$),
            ('enqueue(text,text,jsonb,bytea,text,text,jsonb,text,timestamptz,integer,text,text,boolean)',
             $old$        FROM message_keys AS k
        WHERE k.target = enqueue.url AND k.idempotency_key = enqueue.idempotency_key;
$old$,
             $new$        FROM (SELECT * FROM message_keys UNION ALL SELECT * FROM message_keys_old) AS k
        WHERE k.target = enqueue.url AND k.idempotency_key = enqueue.idempotency_key
        LIMIT 1;
$new$),
            ('_fan_out(text,text,bytea,bytea,bigint,text,integer,jsonb,bigint,boolean)',
             $old$            SELECT k.message_id FROM message_keys AS k
            WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key
            LIMIT 1
$old$,
             $new$            SELECT k.message_id FROM message_keys AS k
            WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key
            UNION ALL
            SELECT k.message_id FROM message_keys_old AS k
            WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key
            LIMIT 1
$new$),
            ('_fan_out(text,text,bytea,bytea,bigint,text,integer,jsonb,bigint,boolean)',
             $old$          AND (_fan_out.record_empty OR EXISTS (SELECT FROM planned))
$old$,
             $new$          AND (_fan_out.record_empty OR EXISTS (SELECT FROM planned))
          AND (pg_catalog.current_setting('transaction_isolation') = 'read committed'
               OR NOT _keys_moved())
          AND NOT EXISTS (SELECT FROM events_old AS o
                          WHERE o.tenant_id = _fan_out.tenant_id
                            AND o.event_key = _fan_out.event_key)
$new$),
            ('publish(text,jsonb,text,text,integer,text,text,boolean,text)',
             $old$    SELECT e.message_ids, e.digest INTO v_found FROM events AS e
    WHERE e.tenant_id = v_tenant AND e.event_key = v_key;
$old$,
             $new$    SELECT e.message_ids, e.digest INTO v_found
    FROM (SELECT * FROM events UNION ALL SELECT * FROM events_old) AS e
    WHERE e.tenant_id = v_tenant AND e.event_key = v_key
    LIMIT 1;
$new$)
        ) AS e (routine, old, new)
    LOOP
        v_text := pg_get_functiondef(v_edit.routine);
        IF strpos(v_text, v_edit.old) = 0 THEN
            RAISE EXCEPTION 'migration 0033: % is not as 0022/0028 made it', v_edit.routine;
        END IF;
        EXECUTE replace(v_text, v_edit.old, v_edit.new);
    END LOOP;
END
$migration$;

-- Only their owner (and the functions above, as it) may call the generation's
-- maintenance; `outbox roles` grants it to the dispatcher. The search path of
-- each is pinned, and that of _keys_moved, which producers call.
DO $migration$
DECLARE
    routine regprocedure;
BEGIN
    EXECUTE format('ALTER FUNCTION _keys_moved() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
    FOR routine IN
        SELECT p.oid::regprocedure
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('_grants_copy', 'key_generation_turn', 'key_generation_carry')
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', routine);
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                       routine, current_schema());
    END LOOP;
END
$migration$;
