-- The operator's view of the outbox's activity (the dashboard's overview and
-- endpoint pages): attempts per minute and per hour, each endpoint's last hour,
-- the dispatchers seen, a destination's breaker. No tenant reads these. Every
-- statement reads a bounded window or returns a bounded number of rows, so a
-- page costs the same on a big history.

-- name: web_minutes
-- Attempts per minute over the last hour, for the overview's chart: a range scan
-- of attempts_started_idx over one hour of attempts, never the whole table.
SELECT date_trunc('minute', started_at) AS minute,
       count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
       count(*) FILTER (WHERE outcome <> 'delivered') AS failed
FROM {schema}.attempts
WHERE started_at >= date_trunc('minute', now()) - interval '59 minutes'
GROUP BY 1
ORDER BY 1

-- name: web_hours
-- Attempts per hour in the whole hours from %(since)s to %(until)s (hours'
-- starts), for the overview's day chart: a range scan of attempts_started_idx
-- over them. The chart keeps the hours that no longer change, so this reads the
-- day once and then only its last hour or two. The hour in progress comes from
-- web_minutes, which covers it. Hours are UTC hours, whatever the session's
-- time zone (some are offset by half an hour).
SELECT date_trunc('hour', started_at, 'UTC') AS minute,
       count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
       count(*) FILTER (WHERE outcome <> 'delivered') AS failed
FROM {schema}.attempts
WHERE started_at >= CAST(%(since)s AS timestamptz)
  AND started_at < CAST(%(until)s AS timestamptz)
GROUP BY 1
ORDER BY 1

-- name: web_dispatchers
-- The dispatchers seen: owners of leases (from the lease partial index) and
-- owners of attempts started in the last hour, with what each holds now, when it
-- was last seen (the end of its latest attempt) and whether it is alive. A
-- dispatcher renews its leases every third of their length, so one holding a
-- lease that has not run out was heard from within its lease period; one that
-- made an attempt in the last minute is alive too. Others have stopped (their
-- leases ran out, or a --drain run exited), or are idle: with no lease and no
-- attempt, the database cannot tell an idle dispatcher from a stopped one.
WITH leases AS (
    SELECT lease_owner AS owner, count(*) AS in_flight, max(lease_until) AS lease_until
    FROM {schema}.messages
    WHERE state = 'running'
    GROUP BY lease_owner
),
recent AS (
    SELECT owner, max(started_at) AS last_attempt_at,
           max(started_at + COALESCE(duration_ms, 0) * interval '1 millisecond') AS last_seen
    FROM {schema}.attempts
    WHERE started_at >= now() - interval '1 hour'
    GROUP BY owner
)
SELECT * FROM (
    SELECT COALESCE(l.owner, r.owner) AS owner, COALESCE(l.in_flight, 0) AS in_flight,
           l.lease_until, r.last_attempt_at, r.last_seen,
           CASE WHEN l.lease_until >= now() OR r.last_seen >= now() - interval '1 minute'
                THEN 'alive'
                WHEN l.lease_until < now() THEN 'lease expired'
                ELSE 'stopped' END AS status
    FROM leases AS l
    FULL JOIN recent AS r ON r.owner = l.owner
) AS seen
ORDER BY status <> 'alive', owner
LIMIT 100

-- name: web_endpoint_hour
-- One endpoint's last hour: its attempts (a range scan of attempts_started_idx),
-- each matched to its message in the hot table or in the history; a delivered
-- message with an attempt in the last hour completed in it, so the history is
-- read over one hour of delivered_endpoint_idx, never the endpoint's whole past.
-- Then how many were delivered, the median and 99th percentile durations, the count of
-- each response status, and the deliveries it has in flight now.
WITH recent AS MATERIALIZED (
    SELECT a.status, a.outcome, a.duration_ms
    FROM {schema}.attempts AS a
    WHERE a.started_at >= now() - interval '1 hour'
      AND (EXISTS (SELECT 1 FROM {schema}.messages AS m
                   WHERE m.id = a.message_id AND m.endpoint_id = %(endpoint_id)s)
           OR EXISTS (SELECT 1 FROM {schema}.delivered AS d
                      WHERE d.id = a.message_id AND d.endpoint_id = %(endpoint_id)s
                        AND d.completed_at >= now() - interval '1 hour'))
)
SELECT count(*) AS attempts,
       count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50_ms,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY duration_ms) AS p99_ms,
       COALESCE((SELECT jsonb_object_agg(COALESCE(CAST(status AS text), 'none'), n)
                 FROM (SELECT status, count(*) AS n FROM recent GROUP BY status) AS s),
                CAST('{{}}' AS jsonb)) AS statuses,
       (SELECT count(*) FROM {schema}.messages AS m
        WHERE m.state = 'running' AND m.endpoint_id = %(endpoint_id)s) AS in_flight
FROM recent

-- name: web_endpoints_hour
-- Every endpoint's last hour, for the endpoints list, as web_endpoint_hour gives
-- it for one: the hour's attempts (a range scan of attempts_started_idx), each
-- matched by primary key to its message in the hot table or, completed in the
-- hour, in the history; then per endpoint how many, how many delivered, the
-- median and 99th percentile durations; and the deliveries in flight now.
WITH recent AS MATERIALIZED (
    SELECT COALESCE(m.endpoint_id, d.endpoint_id) AS endpoint_id, a.outcome, a.duration_ms
    FROM {schema}.attempts AS a
    LEFT JOIN {schema}.messages AS m ON m.id = a.message_id
    LEFT JOIN {schema}.delivered AS d
        ON m.id IS NULL AND d.id = a.message_id
       AND d.completed_at >= now() - interval '1 hour'
    WHERE a.started_at >= now() - interval '1 hour'
), hour AS (
    SELECT endpoint_id, count(*) AS attempts,
           count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50_ms,
           percentile_disc(0.99) WITHIN GROUP (ORDER BY duration_ms) AS p99_ms
    FROM recent
    WHERE endpoint_id IS NOT NULL
    GROUP BY endpoint_id
), running AS (
    SELECT endpoint_id, count(*) AS in_flight
    FROM {schema}.messages
    WHERE state = 'running' AND endpoint_id IS NOT NULL
    GROUP BY endpoint_id
)
SELECT COALESCE(h.endpoint_id, r.endpoint_id) AS endpoint_id,
       COALESCE(h.attempts, 0) AS attempts, COALESCE(h.delivered, 0) AS delivered,
       h.p50_ms, h.p99_ms, COALESCE(r.in_flight, 0) AS in_flight
FROM hour AS h
FULL JOIN running AS r USING (endpoint_id)

-- name: web_destination_health
-- One destination's open or probing breaker, or its Retry-After hold (a hold
-- that has ended is left out), by its primary key.
SELECT destination, state, blocked_until, failed_probes, opened_at, reason
FROM {schema}.destination_health
WHERE destination = %(destination)s AND (state <> 'held' OR blocked_until > now())
