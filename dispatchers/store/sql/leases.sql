-- The heartbeat of the leases a dispatcher holds (dispatchers.store.postgres).
-- Their end, in time or not, is complete.sql's ("complete", "rescue").
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- name: renew
-- One heartbeat for every lease a dispatcher holds. A row missing from the result
-- is a lost lease (rescued, re-claimed, or completed by someone else).
UPDATE {schema}.messages AS m
SET lease_until = now() + make_interval(secs => %(lease_s)s)
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(attempts)s AS integer[])) AS held(id, attempt)
-- one primary key lookup per lease, as in "complete": the state is a subquery so
-- that the plan cannot read the lease index instead, whole, as it would when
-- the statistics were taken on an idle outbox (nothing running, the index
-- thought empty) and the plan is kept while thousands of leases are held
WHERE m.id = held.id
  AND m.attempts = held.attempt
  AND m.lease_owner = %(owner)s
  AND m.state = (SELECT 'running')
RETURNING m.id
