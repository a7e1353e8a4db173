-- What the operator dashboard reads (dispatchers.ui), beside the status snapshot
-- and the dead letters of admin.sql. Every statement reads a bounded window or
-- returns a bounded number of rows, so a page costs the same on a big history.

-- name: ui_minutes
-- Attempts per minute over the last hour, for the overview's chart: a range scan
-- of attempts_started_idx over one hour of attempts, never the whole table.
SELECT date_trunc('minute', started_at) AS minute,
       count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
       count(*) FILTER (WHERE outcome <> 'delivered') AS failed
FROM {schema}.attempts
WHERE started_at >= date_trunc('minute', now()) - interval '59 minutes'
GROUP BY 1
ORDER BY 1

-- name: ui_dispatchers
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

-- fragment: tenant_endpoints
-- The ids of the endpoints of tenant %(tenant)s (its external id), as an array
-- made once per statement (the tenants key, then endpoints_tenant_idx): a
-- search by tenant is a search by these endpoints, which the endpoint indexes
-- of the queue and of the history can probe.
ARRAY(SELECT e.id FROM {schema}.endpoints AS e
      JOIN {schema}.tenants AS t ON t.id = e.tenant_id
      WHERE t.external_id = CAST(%(tenant)s AS text))

-- fragment: messages_found
-- The queue's side of a message search: its columns (held: a ready message whose
-- destination an open breaker or a Retry-After hold blocks, as the claim reads
-- destination_health) and every filter but the page's bound, which the
-- includer adds (ui_messages: older than %(before)s; ui_messages_newer: newer
-- than %(after)s), with its order and scan limit. %(tenant)s: a tenant's
-- messages (of its endpoints), or with '-' (never a tenant's id, which starts
-- with a letter or a digit) those of no tenant: enqueued to a URL, or of an
-- endpoint of none. A message whose endpoint was deleted is neither: whose it
-- was is no longer recorded.
(SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url) AS url, m.endpoint_id,
        t.external_id AS tenant,
        m.event_type, CAST(m.state AS text) AS state, m.attempts, m.last_status,
        m.created_at,
        m.state = 'ready' AND EXISTS (
            SELECT 1 FROM {schema}.destination_health AS dh
            WHERE dh.destination = m.destination
              AND (dh.blocked_until > now() OR dh.state <> 'held')) AS held
 FROM (SELECT *
       FROM {schema}.messages AS m
       WHERE (CAST(%(key)s AS text) IS NULL OR m.idempotency_key = CAST(%(key)s AS text))
         AND (CAST(%(event_type)s AS text) IS NULL
              OR m.event_type = CAST(%(event_type)s AS text))
         AND (CAST(%(endpoint_id)s AS bigint) IS NULL
              OR m.endpoint_id = CAST(%(endpoint_id)s AS bigint))
         AND (CAST(%(state)s AS text) IS NULL OR m.state = CAST(%(state)s AS text))
         AND (CAST(%(created_from)s AS timestamptz) IS NULL
              OR m.created_at >= CAST(%(created_from)s AS timestamptz))
         AND (CAST(%(created_until)s AS timestamptz) IS NULL
              OR m.created_at < CAST(%(created_until)s AS timestamptz))
         AND (CAST(%(tenant)s AS text) IS NULL
              OR m.endpoint_id = ANY ({tenant_endpoints})
              OR (CAST(%(tenant)s AS text) = '-'
                  AND ((m.endpoint_id IS NULL AND NOT starts_with(m.target, 'endpoint:'))
                       OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                                  WHERE e.id = m.endpoint_id AND e.tenant_id IS NULL))))

-- fragment: delivered_found
-- The history's side of a message search, as messages_found is the queue's.
(SELECT d.id, d.idempotency_key, COALESCE(d.url, e.url), d.endpoint_id, t.external_id,
        d.event_type, 'delivered', d.attempts, d.last_status, d.created_at, false
 FROM (SELECT *
       FROM {schema}.delivered AS d
       WHERE (CAST(%(state)s AS text) IS NULL OR CAST(%(state)s AS text) = 'delivered')
         AND (CAST(%(key)s AS text) IS NULL OR d.idempotency_key = CAST(%(key)s AS text))
         AND (CAST(%(event_type)s AS text) IS NULL
              OR d.event_type = CAST(%(event_type)s AS text))
         AND (CAST(%(endpoint_id)s AS bigint) IS NULL
              OR d.endpoint_id = CAST(%(endpoint_id)s AS bigint))
         AND (CAST(%(created_from)s AS timestamptz) IS NULL
              OR (d.created_at >= CAST(%(created_from)s AS timestamptz)
                  AND d.completed_at >= CAST(%(created_from)s AS timestamptz)))
         AND (CAST(%(created_until)s AS timestamptz) IS NULL
              OR d.created_at < CAST(%(created_until)s AS timestamptz))
         AND (CAST(%(tenant)s AS text) IS NULL
              OR d.endpoint_id = ANY ({tenant_endpoints})
              OR (CAST(%(tenant)s AS text) = '-'
                  AND ((d.endpoint_id IS NULL AND NOT starts_with(d.target, 'endpoint:'))
                       OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                                  WHERE e.id = d.endpoint_id AND e.tenant_id IS NULL))))

-- name: ui_messages
-- Messages matching an operator's search, newest first, older than id
-- %(before)s when it is given (keyset paging: a range scan of each primary key,
-- as cheap far back as at the start), from the hot table and the history: each
-- side is cut at the limit before the two are merged. A filter left NULL matches
-- every message; the state 'delivered' names the history. A message completes
-- after it is created, so "created since" also bounds the history's completion
-- time, which delivered_completed_idx can range over. %(body)s, when given, is
-- looked for in the bodies of the newest %(scan)s messages of each side that
-- match the other filters, never more (the caller passes %(limit)s as %(scan)s
-- without it). held: a ready message whose destination an open breaker or a
-- Retry-After hold blocks, as the claim reads destination_health.
{messages_found}
         AND (CAST(%(before)s AS bigint) IS NULL OR m.id < CAST(%(before)s AS bigint))
       ORDER BY m.id DESC
       LIMIT %(scan)s) AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN m.body) > 0
 ORDER BY m.id DESC
 LIMIT %(limit)s)
UNION ALL
{delivered_found}
         AND (CAST(%(before)s AS bigint) IS NULL OR d.id < CAST(%(before)s AS bigint))
       ORDER BY d.id DESC
       LIMIT %(scan)s) AS d
 LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN d.body) > 0
 ORDER BY d.id DESC
 LIMIT %(limit)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: ui_messages_newer
-- ui_messages the other way: the messages just newer than id %(after)s, oldest
-- first (the caller shows them newest first).
{messages_found}
         AND (CAST(%(after)s AS bigint) IS NULL OR m.id > CAST(%(after)s AS bigint))
       ORDER BY m.id ASC
       LIMIT %(scan)s) AS m
 LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN m.body) > 0
 ORDER BY m.id ASC
 LIMIT %(limit)s)
UNION ALL
{delivered_found}
         AND (CAST(%(after)s AS bigint) IS NULL OR d.id > CAST(%(after)s AS bigint))
       ORDER BY d.id ASC
       LIMIT %(scan)s) AS d
 LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
 LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
 WHERE CAST(%(body)s AS bytea) IS NULL OR position(CAST(%(body)s AS bytea) IN d.body) > 0
 ORDER BY d.id ASC
 LIMIT %(limit)s)
ORDER BY id ASC
LIMIT %(limit)s

-- name: ui_hours
-- Attempts per hour in the whole hours from %(since)s to %(until)s (hours'
-- starts), for the overview's day chart: a range scan of attempts_started_idx
-- over them. The chart keeps the hours that no longer change, so this reads the
-- day once and then only its last hour or two. The hour in progress comes from
-- ui_minutes, which covers it. Hours are UTC hours, whatever the session's time
-- zone (some are offset by half an hour).
SELECT date_trunc('hour', started_at, 'UTC') AS minute,
       count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
       count(*) FILTER (WHERE outcome <> 'delivered') AS failed
FROM {schema}.attempts
WHERE started_at >= CAST(%(since)s AS timestamptz)
  AND started_at < CAST(%(until)s AS timestamptz)
GROUP BY 1
ORDER BY 1

-- name: ui_endpoint_hour
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

-- name: ui_endpoints_hour
-- Every endpoint's last hour, for the endpoints list, as ui_endpoint_hour gives
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

-- name: ui_endpoint_attempts
-- One endpoint's latest attempts of the last hour, newest first, matched to their
-- messages as in ui_endpoint_hour.
SELECT a.message_id, a.attempt, a.owner, a.started_at, a.duration_ms, a.status,
       a.outcome, a.error_class
FROM {schema}.attempts AS a
WHERE a.started_at >= now() - interval '1 hour'
  AND (EXISTS (SELECT 1 FROM {schema}.messages AS m
               WHERE m.id = a.message_id AND m.endpoint_id = %(endpoint_id)s)
       OR EXISTS (SELECT 1 FROM {schema}.delivered AS d
                  WHERE d.id = a.message_id AND d.endpoint_id = %(endpoint_id)s
                    AND d.completed_at >= now() - interval '1 hour'))
ORDER BY a.started_at DESC
LIMIT %(limit)s

-- name: ui_destination_health
-- One destination's open or probing breaker, or its Retry-After hold (a hold
-- that has ended is left out), by its primary key.
SELECT destination, state, blocked_until, failed_probes, opened_at, reason
FROM {schema}.destination_health
WHERE destination = %(destination)s AND (state <> 'held' OR blocked_until > now())

-- name: ui_endpoint_page
-- One page of the endpoints list: up to %(limit)s endpoints after id %(after)s,
-- by id (keyset: a range scan of endpoints_pkey, as cheap on the last page as on
-- the first), only those that need attention when %(attention)s is true
-- (disabled, failing, or with dead messages). Each with its first event types
-- (the page says how many there are), the start of why it was disabled, its
-- signing secrets that still sign as stored (sealed or not: the dashboard opens
-- them if it holds the key), and its messages pending and dead, counted on
-- messages_endpoint_idx for this page's endpoints only. With %(tenant)s, that
-- tenant's endpoints only (a range scan of endpoints_tenant_idx), or with '-'
-- those of no tenant.
SELECT e.id, e.url, e.description, t.external_id AS tenant,
       e.event_types[1:%(types)s] AS event_types,
       cardinality(e.event_types) AS event_type_count, e.enabled,
       left(e.disabled_reason, 300) AS disabled_reason, e.failure_streak,
       e.failing_since, e.last_success_at, e.max_concurrency,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                            'secret', s.secret, 'key_id', s.key_id,
                            'expires_at', s.expires_at)
                        ORDER BY s.id DESC)
                 FROM {schema}.endpoint_secrets AS s
                 WHERE s.endpoint_id = e.id
                   AND (s.expires_at IS NULL OR s.expires_at > now())), '[]') AS secrets,
       c.pending, c.dead
FROM {schema}.endpoints AS e
LEFT JOIN {schema}.tenants AS t ON t.id = e.tenant_id
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE m.state IN ('ready', 'running', 'paused')) AS pending,
           count(*) FILTER (WHERE m.state = 'dead') AS dead
    FROM {schema}.messages AS m
    WHERE m.endpoint_id = e.id
) AS c
WHERE e.id > %(after)s
  AND (CAST(%(tenant)s AS text) IS NULL
       OR e.tenant_id = (SELECT id FROM {schema}.tenants
                         WHERE external_id = CAST(%(tenant)s AS text))
       OR (CAST(%(tenant)s AS text) = '-' AND e.tenant_id IS NULL))
  AND (NOT %(attention)s OR NOT e.enabled OR e.failure_streak > 0 OR c.dead > 0)
ORDER BY e.id
LIMIT %(limit)s

-- name: ui_sealed_secrets
-- Whether any signing secret is sealed: then a secret rotated without a key
-- would be the one stored in plain text.
SELECT EXISTS (SELECT 1 FROM {schema}.endpoint_secrets WHERE key_id IS NOT NULL) AS sealed

-- name: ui_endpoint_tenants
-- The tenants of the endpoints %(ids)s (a page's, at most a hundred), by
-- endpoints_pkey: the rows the library's functions return (the dead letters,
-- the overview's endpoints) name their endpoint, not its tenant.
SELECT e.id, t.external_id AS tenant
FROM {schema}.endpoints AS e
JOIN {schema}.tenants AS t ON t.id = e.tenant_id
WHERE e.id = ANY (CAST(%(ids)s AS bigint[]))
