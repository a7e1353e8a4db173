-- The circuit breakers and holds of destinations (dispatchers.runtime.breakers,
-- through dispatchers.store.postgres): the writes of destination_health after
-- an outcome. Claims read the table (claim.sql, the "health_*" fragments).
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- name: health_open
-- Open a destination's breaker (a dispatcher's recent outcomes with it said so,
-- see dispatchers.delivery.health), blocked for %(backoff_s)s, unless it is open or
-- probing already: another dispatcher opened it first, and its back-off stands.
-- A hold becomes an open breaker, blocked at least until the hold ends. Returns
-- the row only when this statement opened it.
INSERT INTO {schema}.destination_health AS dh (
    destination, state, blocked_until, opened_at, reason
)
VALUES (%(destination)s, 'open', now() + make_interval(secs => %(backoff_s)s), now(),
        %(reason)s)
ON CONFLICT (destination) DO UPDATE
SET state = 'open',
    blocked_until = GREATEST(dh.blocked_until, excluded.blocked_until),
    opened_at = now(),
    failed_probes = 0,
    reason = excluded.reason,
    updated_at = now()
WHERE dh.state = 'held'
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_hold
-- Hold a destination for %(hold_s)s (a 429 or 503 with Retry-After): no claim
-- takes its messages before then. Only ever lengthens what blocks it; an open
-- or probing breaker stays so. Returns the row when this statement lengthened it.
INSERT INTO {schema}.destination_health AS dh (destination, state, blocked_until, reason)
VALUES (%(destination)s, 'held', now() + make_interval(secs => %(hold_s)s), %(reason)s)
ON CONFLICT (destination) DO UPDATE
SET blocked_until = excluded.blocked_until,
    reason = CASE WHEN dh.state = 'held' THEN excluded.reason ELSE dh.reason END,
    updated_at = now()
WHERE dh.blocked_until < excluded.blocked_until
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_close
-- The probe %(owner)s took succeeded: the breaker closes and the destination's
-- messages are claimed again. Fenced by the probe's owner and state, so that a
-- probe whose lease passed (another one was taken since) changes nothing.
DELETE FROM {schema}.destination_health AS dh
WHERE dh.destination = %(destination)s AND dh.state = 'probing'
  AND dh.probe_owner = %(owner)s
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_unprobe
-- The probe %(owner)s took never reached the destination (the SSRF guard
-- refused it, the client could not send it, or our own code failed: see
-- dispatchers.delivery.health.is_counted), so it says nothing of the destination's
-- health: the breaker stays open, its probe free for the next claim at once,
-- and its count of failed probes unchanged. Fenced as "health_close".
UPDATE {schema}.destination_health AS dh
SET state = 'open',
    probe_owner = NULL,
    blocked_until = now(),
    updated_at = now()
WHERE dh.destination = %(destination)s AND dh.state = 'probing'
  AND dh.probe_owner = %(owner)s
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes

-- name: health_reopen
-- The probe %(owner)s took failed: the breaker opens again, for a back-off that
-- doubles with each failed probe in a row, from %(backoff_s)s up to
-- %(backoff_max_s)s, and lasts at least %(hold_s)s (the Retry-After the probe
-- was answered with, or 0). Fenced as "health_close".
UPDATE {schema}.destination_health AS dh
SET state = 'open',
    probe_owner = NULL,
    failed_probes = dh.failed_probes + 1,
    blocked_until = now() + make_interval(secs => GREATEST(
        LEAST(%(backoff_s)s * power(2, LEAST(dh.failed_probes + 1, 30)), %(backoff_max_s)s),
        %(hold_s)s)),
    updated_at = now()
WHERE dh.destination = %(destination)s AND dh.state = 'probing'
  AND dh.probe_owner = %(owner)s
RETURNING dh.destination, dh.state, dh.blocked_until, dh.failed_probes
