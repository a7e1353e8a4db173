-- The session statements around the dispatcher's work: the timeouts sent ahead
-- of each statement (dispatchers.store.postgres), and the waker's connection,
-- its LISTEN and its advisory locks (dispatchers.runtime.waker).
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier, "{channel}" the quoted name of the
-- schema's notification channel; parameters use psycopg's %(name)s style.

-- name: set_timeouts
-- Sent ahead of each statement, local to its transaction (dispatchers.store.postgres). JIT
-- off: the dispatcher's statements are short, and a JIT-enabled server (as
-- distributions and managed services ship PostgreSQL) would compile any whose
-- estimated cost passes jit_above_cost, for seconds at each execution; the
-- claim's generic plan estimates its LIMITs as a share of the table, so its cost
-- passes the thresholds once the backlog is a few hundred messages deep.
SELECT set_config('statement_timeout', %(outbox_statement_timeout)s, true),
       set_config('lock_timeout', %(outbox_lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(outbox_idle_timeout)s, true),
       set_config('jit', 'off', true)

-- name: set_timeouts_prepared
-- set_timeouts, plus how a prepared statement is planned (dispatchers.store.postgres): a
-- generic plan, once per connection; and the size of the hot table in pages,
-- which the plans depend on (dispatchers.store.postgres re-plans them as it grows).
SELECT set_config('statement_timeout', %(outbox_statement_timeout)s, true),
       set_config('lock_timeout', %(outbox_lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(outbox_idle_timeout)s, true),
       set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       pg_relation_size('{schema}.messages')
           / CAST(current_setting('block_size') AS integer) AS hot_pages

-- name: waker_session
-- The waker's session connection (dispatchers.runtime.waker, never pooled): its one
-- lock wait bounded by lock_timeout, every statement by statement_timeout, and
-- a vanished dispatcher noticed (its locks freed) by TCP keepalives.
SELECT set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('tcp_keepalives_idle', '10', false),
       set_config('tcp_keepalives_interval', '5', false),
       set_config('tcp_keepalives_count', '3', false)

-- name: waker_listen
LISTEN {channel}

-- name: waker_unlisten
UNLISTEN {channel}

-- name: waker_lock
-- Waits for the lock, at most lock_timeout.
SELECT pg_advisory_lock(%(class)s, %(object)s)

-- name: waker_try_lock
SELECT pg_try_advisory_lock(%(class)s, %(object)s)

-- name: waker_unlock
SELECT pg_advisory_unlock(%(class)s, %(object)s)

-- name: waker_unlock_all
SELECT pg_advisory_unlock_all()
