-- What an operator runs: dead letters, replay, one message, the status snapshot
-- (outbox.admin). Placeholders as in enqueue.sql.

-- fragment: tenant_selection
-- Whose dead messages: %(tenant)s NULL selects every message's; a tenant's
-- external id, those of its endpoints (an array made once, by the tenants key
-- and endpoints_tenant_idx, which messages_endpoint_idx can probe); '-' (never
-- a tenant's id, which starts with a letter or a digit), those of no tenant:
-- enqueued to a URL, or of the operator's own endpoints. A message whose
-- endpoint was deleted is no tenant's and not the operator's either: whose it
-- was is no longer recorded.
(CAST(%(tenant)s AS text) IS NULL
 OR m.endpoint_id = ANY (ARRAY(SELECT e.id FROM {schema}.endpoints AS e
                               JOIN {schema}.tenants AS t ON t.id = e.tenant_id
                               WHERE t.external_id = CAST(%(tenant)s AS text)))
 OR (CAST(%(tenant)s AS text) = '-'
     AND ((m.endpoint_id IS NULL AND NOT starts_with(m.target, 'endpoint:'))
          OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                     WHERE e.id = m.endpoint_id AND e.tenant_id IS NULL))))

-- name: dead_list
-- Dead messages for an operator, newest first: a backward scan of the dead
-- partial index (completed_at, id). A message of a deleted endpoint keeps its
-- endpoint id in its target ("endpoint:<id>"), so the endpoint filter matches
-- on the target and finds those too.
SELECT m.id, m.idempotency_key, COALESCE(m.url, e.url) AS url,
       COALESCE(m.endpoint_id,
                CASE WHEN starts_with(m.target, 'endpoint:')
                     THEN CAST(substr(m.target, 10) AS bigint) END) AS endpoint_id,
       m.event_type, m.attempts, m.max_attempts, m.last_status, m.last_error,
       m.created_at, m.completed_at
FROM {schema}.messages AS m
LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
WHERE m.state = 'dead'
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL
       OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
  AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
  AND (CAST(%(since)s AS timestamptz) IS NULL
       OR m.completed_at >= CAST(%(since)s AS timestamptz))
  AND {tenant_selection}
ORDER BY m.completed_at DESC, m.id DESC
LIMIT %(limit)s

-- name: dead_found
-- Which of the given ids are dead messages (a retry or purge by id reports the
-- others by id).
SELECT m.id
FROM {schema}.messages AS m
WHERE m.state = 'dead' AND m.id = ANY (CAST(%(ids)s AS bigint[]))

-- name: dead_count
-- How many dead messages a retry or purge with the same selection would touch
-- (asked before an operator confirms a purge).
SELECT count(*)
FROM {schema}.messages AS m
WHERE m.state = 'dead'
  AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
  AND (CAST(%(endpoint_id)s AS bigint) IS NULL
       OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
  AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
  AND (CAST(%(since)s AS timestamptz) IS NULL
       OR m.completed_at >= CAST(%(since)s AS timestamptz))
  AND {tenant_selection}

-- name: dead_retry
-- Redrive dead messages with a fresh attempt budget. attempts is kept: attempt
-- numbers are the fencing tokens of claims and part of the attempts table's key,
-- so they must never repeat; the budget is raised instead (max_attempts =
-- attempts + budget). The key, body and id stay, so the receiver sees the same
-- Idempotency-Key / webhook-id and dedupes a delivery that did land before.
-- A message of a disabled endpoint is paused (enabling the endpoint resumes it);
-- one whose endpoint was deleted stays dead: it would go out unsigned to a URL
-- nobody manages any more.
WITH chosen AS (
    SELECT m.id, e.enabled
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
    WHERE m.state = 'dead'
      AND m.expunged_at IS NULL  -- it would send the marker
      AND (m.endpoint_id IS NOT NULL OR NOT starts_with(m.target, 'endpoint:'))
      AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
      AND (CAST(%(endpoint_id)s AS bigint) IS NULL
           OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
      AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
      AND (CAST(%(since)s AS timestamptz) IS NULL
           OR m.completed_at >= CAST(%(since)s AS timestamptz))
      AND {tenant_selection}
    ORDER BY m.id
    FOR UPDATE OF m
), retried AS (
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN chosen.enabled IS FALSE THEN 'paused' ELSE 'ready' END,
        max_attempts = m.attempts + CASE WHEN m.endpoint_id IS NULL
                                         THEN CAST(%(budget)s AS integer)
                                         ELSE CAST(%(webhook_budget)s AS integer) END,
        retry_base = m.attempts,
        available_at = now(),
        completed_at = NULL
    FROM chosen
    WHERE m.id = chosen.id AND m.state = 'dead'
    RETURNING m.id, m.state
)
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT count(*) FROM retried WHERE state = 'paused') AS paused{notify}

-- name: message_cancel
-- Cancel waiting messages: those ready (due or scheduled) or paused become dead,
-- with the reason as their last error, so no dispatcher sends them (a claim takes
-- ready messages only; retrying them as dead letters sends them again, purging
-- deletes them). A running message is left alone: a dispatcher holds its lease
-- and may be sending it. The row lock decides a race with a claim: a claim skips
-- a row this statement locked, and this statement, having waited for a claim's
-- lock, reads the row again and finds it running.
UPDATE {schema}.messages AS m
SET state = 'dead', last_error = %(reason)s, completed_at = now()
WHERE m.id = ANY (CAST(%(ids)s AS bigint[])) AND m.state IN ('ready', 'paused')
RETURNING m.id

-- name: dead_purge
-- Delete dead messages and their attempt rows. Their message_keys rows stay:
-- the key remains used, so enqueuing it again returns the purged id and writes
-- nothing (the request may have had its effect before it was declared dead).
WITH chosen AS (
    SELECT m.id
    FROM {schema}.messages AS m
    WHERE m.state = 'dead'
      AND (CAST(%(ids)s AS bigint[]) IS NULL OR m.id = ANY (CAST(%(ids)s AS bigint[])))
      AND (CAST(%(endpoint_id)s AS bigint) IS NULL
           OR m.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint))
      AND (CAST(%(event_type)s AS text) IS NULL OR m.event_type = CAST(%(event_type)s AS text))
      AND (CAST(%(since)s AS timestamptz) IS NULL
           OR m.completed_at >= CAST(%(since)s AS timestamptz))
      AND {tenant_selection}
    ORDER BY m.id
    FOR UPDATE
), purged AS (
    DELETE FROM {schema}.messages AS m
    USING chosen
    WHERE m.id = chosen.id AND m.state = 'dead'
    RETURNING m.id
), forgotten AS (
    DELETE FROM {schema}.attempts AS a
    USING purged
    WHERE a.message_id = purged.id
)
SELECT count(*) FROM purged

-- name: replay_endpoint
-- The endpoint a replay targets. FOR KEY SHARE keeps it from being deleted
-- until the replay commits, without blocking the dispatchers' health updates.
SELECT id, enabled, disabled_reason
FROM {schema}.endpoints
WHERE id = %(endpoint_id)s
FOR KEY SHARE

-- fragment: replayed_from_history
-- Move the history rows "chosen" holds back into the hot table with their id,
-- key and body (state ready), so the same webhook-id goes out and receivers
-- dedupe. attempts is kept (attempt numbers never repeat); the budget is raised
-- on top of it. Webhook messages only: their destination is their target,
-- "endpoint:<id>". Each one's key is written into the current generation of
-- keys if it is not there (migration 0033): a message back in the outbox
-- keeps its key as long as it is there, which the carry after each turn sees
-- to only for the keys it finds in the previous generation.
moved AS (
    DELETE FROM {schema}.delivered AS d
    USING chosen
    WHERE d.id = chosen.id
    RETURNING d.*
), rekeyed AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    SELECT target, idempotency_key, id FROM moved
    ON CONFLICT (target, idempotency_key) DO NOTHING
), replayed AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, attempts, max_attempts,
        retry_base, available_at, last_status, created_at
    )
    -- an endpoint's message names no URL (0034), whatever an older version kept
    SELECT id, idempotency_key, target, target, endpoint_id,
           CASE WHEN endpoint_id IS NULL THEN url END, method, headers, body,
           content_type, event_type, ordering_key, 'ready', attempts,
           attempts + CAST(%(budget)s AS integer), attempts, now(), last_status, created_at
    FROM moved
    RETURNING id
)

-- name: replay
-- Send an endpoint's delivered messages of a time window again
-- ("replayed_from_history"). Walks delivered_endpoint_idx.
WITH chosen AS (
    SELECT d.id
    FROM {schema}.delivered AS d
    WHERE d.endpoint_id = %(endpoint_id)s
      AND d.expunged_at IS NULL
      AND d.completed_at >= CAST(%(since)s AS timestamptz)
      AND (CAST(%(until)s AS timestamptz) IS NULL
           OR d.completed_at < CAST(%(until)s AS timestamptz))
    ORDER BY d.id
    FOR UPDATE
), {replayed_from_history}
SELECT count(*){notify} FROM replayed

-- name: replay_message_endpoint
-- The endpoint of a delivered message, for replay_message to check first.
SELECT endpoint_id, expunged_at FROM {schema}.delivered WHERE id = %(id)s

-- name: replay_message
-- Send one delivered webhook message again ("replayed_from_history").
WITH chosen AS (
    SELECT d.id
    FROM {schema}.delivered AS d
    WHERE d.id = %(id)s AND d.endpoint_id IS NOT NULL AND d.expunged_at IS NULL
    FOR UPDATE
), {replayed_from_history}
SELECT count(*){notify} FROM replayed

-- name: replay_event
-- Send a recorded event to one endpoint (one subscribed after the event was
-- published, or one whose message was purged): publish is once per event key,
-- so this is how an old event reaches a new endpoint without going out again to
-- the others. The payload is the body of a message the event wrote, in the hot
-- table or the history (every endpoint's body is the same envelope); the new
-- message is keyed "<event key>:<endpoint id>", its webhook-id, as publish keys
-- it, and the event records its id. An endpoint that has the event's message
-- already keeps it: its id comes back, with created false. The event row is
-- locked, so two of these for one event and endpoint write one message. The
-- event and the key are found in either generation (migration 0033); the key
-- is written in the current one, and the event's record where it is.
WITH tenant AS (
    -- the endpoint's tenant (0: none): event keys are a tenant's own
    SELECT COALESCE((SELECT e.tenant_id FROM {schema}.endpoints AS e
                     WHERE e.id = %(endpoint_id)s), 0) AS id
), event_current AS (
    SELECT message_ids, expunged_at
    FROM {schema}.events
    WHERE tenant_id = (SELECT id FROM tenant) AND event_key = %(event_key)s
    FOR UPDATE
), event_old AS (
    SELECT message_ids, expunged_at
    FROM {schema}.events_old
    WHERE tenant_id = (SELECT id FROM tenant) AND event_key = %(event_key)s
    FOR UPDATE
), event AS (
    SELECT * FROM event_current UNION ALL SELECT * FROM event_old
), source AS (
    SELECT s.body, s.event_type, s.ordering_key
    FROM event
    CROSS JOIN LATERAL (
        SELECT m.id, m.body, m.event_type, m.ordering_key
        FROM {schema}.messages AS m
        WHERE m.id = ANY (event.message_ids) AND m.expunged_at IS NULL
        UNION ALL
        SELECT d.id, d.body, d.event_type, d.ordering_key
        FROM {schema}.delivered AS d
        WHERE d.id = ANY (event.message_ids) AND d.expunged_at IS NULL
        ORDER BY 1
        LIMIT 1
    ) AS s
    WHERE event.expunged_at IS NULL  -- an expunged event is refused, never sent
), existing AS (
    SELECT k.message_id
    FROM {schema}.message_keys AS k
    WHERE k.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint)
      AND k.idempotency_key = %(event_key)s || ':' || CAST(%(endpoint_id)s AS bigint)
    UNION ALL
    SELECT k.message_id
    FROM {schema}.message_keys_old AS k
    WHERE k.target = 'endpoint:' || CAST(%(endpoint_id)s AS bigint)
      AND k.idempotency_key = %(event_key)s || ':' || CAST(%(endpoint_id)s AS bigint)
    LIMIT 1
), ordered AS MATERIALIZED (
    -- the event's ordering key locked before the id is drawn, as publish does
    -- (enqueue.sql, "ordered"): its id then follows the key's commit order
    SELECT pg_advisory_xact_lock(hashtextextended(s.ordering_key, hashtext('{schema}')))
    FROM source AS s
    WHERE s.ordering_key IS NOT NULL AND NOT EXISTS (SELECT FROM existing)
), new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    SELECT 'endpoint:' || CAST(%(endpoint_id)s AS bigint),
           %(event_key)s || ':' || CAST(%(endpoint_id)s AS bigint),
           nextval('{schema}.messages_id_seq')
    FROM source
    CROSS JOIN (SELECT count(*) FROM ordered) AS after_lock
    WHERE NOT EXISTS (SELECT FROM existing)
      AND (current_setting('transaction_isolation') = 'read committed'
           OR NOT {schema}._keys_moved())
    ON CONFLICT (target, idempotency_key) DO NOTHING
    RETURNING target, idempotency_key, message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts
    )
    SELECT k.message_id, k.idempotency_key, k.target, k.target, CAST(%(endpoint_id)s AS bigint),
           NULL, 'POST', CAST('{{}}' AS jsonb), s.body, 'application/json', s.event_type,
           s.ordering_key, 'ready', CAST(%(budget)s AS integer)
    FROM new_key AS k
    CROSS JOIN source AS s
    RETURNING id
), recorded AS (
    UPDATE {schema}.events AS e
    SET message_ids = e.message_ids || ARRAY(SELECT id FROM new_message)
    WHERE e.tenant_id = (SELECT id FROM tenant)
      AND e.event_key = %(event_key)s AND EXISTS (SELECT FROM new_message)
), recorded_old AS (
    UPDATE {schema}.events_old AS e
    SET message_ids = e.message_ids || ARRAY(SELECT id FROM new_message)
    WHERE e.tenant_id = (SELECT id FROM tenant)
      AND e.event_key = %(event_key)s AND EXISTS (SELECT FROM new_message)
)
SELECT EXISTS (SELECT FROM event) AS recorded,
       (SELECT expunged_at FROM event) AS expunged_at,
       EXISTS (SELECT FROM source) AS payload,
       COALESCE((SELECT id FROM new_message), (SELECT message_id FROM existing)) AS id,
       EXISTS (SELECT FROM new_message) AS created{notify}

-- name: test_event
-- One test event for one endpoint, as an operator's "send a test event": a
-- message keyed "<key>:<endpoint id>" like a published event's (that is its
-- webhook-id), signed and sent as every webhook is, with one attempt so that
-- its outcome shows at once. No event is recorded: nothing publishes it again.
WITH new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    VALUES ('endpoint:' || CAST(%(endpoint_id)s AS bigint),
            %(event_key)s || ':' || CAST(%(endpoint_id)s AS bigint),
            nextval('{schema}.messages_id_seq'))
    RETURNING target, idempotency_key, message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, state, max_attempts
    )
    SELECT message_id, idempotency_key, target, target, CAST(%(endpoint_id)s AS bigint), NULL,
           'POST', CAST('{{}}' AS jsonb), CAST(%(body)s AS bytea), 'application/json',
           CAST(%(event_type)s AS text), 'ready', 1
    FROM new_key
    RETURNING id
)
SELECT id{notify} FROM new_message

-- name: message_get
-- One message, from the hot table or (state 'delivered') from the history.
SELECT m.id, m.idempotency_key, m.target,
       COALESCE(m.endpoint_id,
                CASE WHEN starts_with(m.target, 'endpoint:')
                     THEN CAST(substr(m.target, 10) AS bigint) END) AS endpoint_id,
       COALESCE(m.url, e.url) AS url, m.method, m.headers, m.body, m.content_type,
       m.event_type, m.ordering_key, m.state, m.attempts, m.max_attempts,
       m.available_at, m.lease_owner, m.lease_until, m.last_status, m.last_error,
       m.created_at, m.completed_at
FROM {schema}.messages AS m
LEFT JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
WHERE m.id = %(id)s
UNION ALL
SELECT d.id, d.idempotency_key, d.target, d.endpoint_id, COALESCE(d.url, e.url),
       d.method, d.headers, d.body, d.content_type, d.event_type, d.ordering_key,
       'delivered', d.attempts, d.max_attempts, NULL, NULL, NULL, d.last_status, NULL,
       d.created_at, d.completed_at
FROM {schema}.delivered AS d
LEFT JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
WHERE d.id = %(id)s

-- name: message_attempts
SELECT attempt, owner, started_at, duration_ms, status, outcome, error_class, error,
       response_excerpt
FROM {schema}.attempts
WHERE message_id = %(id)s
ORDER BY attempt

-- name: status_counts
-- The backlog by state, lease health, lag and recent throughput. Ready and
-- running counts walk their partial indexes; lag is how long the oldest due
-- message has waited since it became due (not since it was created, so a
-- scheduled or retried message does not look late). A due message whose
-- destination an open breaker or a Retry-After hold blocks (as the claim reads
-- destination_health) is counted as blocked, not ready, and has no lag: no
-- dispatcher may take it yet. A message a dispatcher held unsent (its last error
-- says why) is scheduled, and counted again as held_unsent.
WITH blocking AS MATERIALIZED (
    SELECT dh.destination FROM {schema}.destination_health AS dh
    WHERE dh.blocked_until > now() OR dh.state <> 'held'
)
SELECT
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND m.available_at <= now()
       AND m.destination NOT IN (SELECT destination FROM blocking)) AS ready,
    (SELECT count(*) FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND m.available_at <= now()
       AND m.destination IN (SELECT destination FROM blocking)) AS blocked,
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'ready' AND available_at > now()) AS scheduled,
    -- of those, held unsent by a dispatcher (a destination its SSRF guard
    -- refused, signing secrets it could not open): last_error says why
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'ready' AND available_at > now()
       AND starts_with(last_error, 'held unsent: ')) AS held_unsent,
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'running' AND lease_until >= now()) AS running,
    (SELECT count(*) FROM {schema}.messages
     WHERE state = 'running' AND lease_until < now()) AS lease_expired,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'paused') AS paused,
    (SELECT count(*) FROM {schema}.messages WHERE state = 'dead') AS dead,
    (SELECT CAST(EXTRACT(epoch FROM now() - min(m.available_at)) AS double precision)
     FROM {schema}.messages AS m
     WHERE m.state = 'ready' AND m.available_at <= now()
       AND m.destination NOT IN (SELECT destination FROM blocking)) AS oldest_ready_age_s,
    (SELECT count(*) FROM {schema}.attempts
     WHERE started_at >= now() - interval '5 minutes' AND outcome = 'delivered')
        AS delivered,
    (SELECT count(*) FROM {schema}.attempts
     WHERE started_at >= now() - interval '5 minutes' AND outcome <> 'delivered')
        AS failed,
    now() AS now

-- name: status_endpoints
-- Per endpoint: health, and its messages still to deliver (ready, running,
-- paused) and dead.
SELECT e.id, e.url, e.enabled, e.disabled_reason, e.failure_streak, e.last_success_at,
       count(m.id) FILTER (WHERE m.state IN ('ready', 'running', 'paused')) AS pending,
       count(m.id) FILTER (WHERE m.state = 'dead') AS dead
FROM {schema}.endpoints AS e
LEFT JOIN {schema}.messages AS m ON m.endpoint_id = e.id
GROUP BY e.id
ORDER BY e.id

-- name: status_destination_health
-- Destinations whose breaker is open or probing, or that a Retry-After holds
-- (a hold that has ended is left out), by name.
SELECT destination, state, blocked_until, failed_probes, opened_at, reason
FROM {schema}.destination_health
WHERE state <> 'held' OR blocked_until > now()
ORDER BY destination

-- name: status_secrets
-- Signing secrets, client keys and endpoints' credentials by the key that seals
-- them (NULL: plain text).
SELECT key_id, count(*) AS secrets
FROM (SELECT key_id FROM {schema}.endpoint_secrets
      UNION ALL
      SELECT client_key_id FROM {schema}.endpoints WHERE client_key IS NOT NULL
      UNION ALL
      SELECT auth_key_id FROM {schema}.endpoints WHERE auth IS NOT NULL)
    AS stored (key_id)
GROUP BY key_id
ORDER BY key_id NULLS FIRST

-- name: expunge
-- Replace what the chosen messages said with a marker (migration 0025): in the
-- hot table and the history, their body (%(marker)s) and headers, and the
-- response excerpts of their attempts; keep ids, keys, times, states, statuses
-- and digests. A message waiting (ready or paused) is cancelled: dead, "expunged
-- before delivery", so no dispatcher sends the marker. A running one is left
-- as it is, and counted: a dispatcher may be sending it; expunge again once it
-- is recorded. Chosen by one of: an event (of a tenant, or of none), recorded
-- messages and history included, and its record marked; an endpoint's messages
-- created before a time; every message with a key. The erasure is recorded in
-- expunges, with the counts; never the content. An event's record is found
-- in either generation (migration 0033).
WITH tenant AS (
    SELECT COALESCE((SELECT t.id FROM {schema}.tenants AS t
                     WHERE t.external_id = %(tenant)s), 0) AS id
), event_current AS (
    SELECT e.tenant_id, e.event_key, e.message_ids
    FROM {schema}.events AS e
    WHERE CAST(%(event_key)s AS text) IS NOT NULL
      AND e.tenant_id = (SELECT id FROM tenant) AND e.event_key = %(event_key)s
    FOR UPDATE
), event_old AS (
    SELECT e.tenant_id, e.event_key, e.message_ids
    FROM {schema}.events_old AS e
    WHERE CAST(%(event_key)s AS text) IS NOT NULL
      AND e.tenant_id = (SELECT id FROM tenant) AND e.event_key = %(event_key)s
    FOR UPDATE
), event AS (
    SELECT * FROM event_current UNION ALL SELECT * FROM event_old
), chosen AS (
    SELECT unnest(event.message_ids) AS id FROM event
    UNION
    SELECT m.id FROM {schema}.messages AS m
    WHERE m.endpoint_id = %(endpoint_id)s AND m.created_at < %(before)s
    UNION
    SELECT d.id FROM {schema}.delivered AS d
    WHERE d.endpoint_id = %(endpoint_id)s AND d.created_at < %(before)s
    UNION
    SELECT m.id FROM {schema}.messages AS m WHERE m.idempotency_key = %(key)s
    UNION
    SELECT d.id FROM {schema}.delivered AS d WHERE d.idempotency_key = %(key)s
), hot AS (
    SELECT m.id, m.state
    FROM {schema}.messages AS m
    JOIN chosen USING (id)
    WHERE m.expunged_at IS NULL
    FOR UPDATE OF m
), hot_expunged AS (
    UPDATE {schema}.messages AS m
    SET body = %(marker)s, headers = '{{}}', expunged_at = now(),
        state = CASE WHEN hot.state IN ('ready', 'paused') THEN 'dead' ELSE m.state END,
        last_error = CASE WHEN hot.state IN ('ready', 'paused')
                          THEN 'expunged before delivery' ELSE m.last_error END,
        completed_at = CASE WHEN hot.state IN ('ready', 'paused')
                            THEN now() ELSE m.completed_at END
    FROM hot
    WHERE m.id = hot.id AND hot.state <> 'running'
    RETURNING m.id
), history_expunged AS (
    UPDATE {schema}.delivered AS d
    SET body = %(marker)s, headers = '{{}}', expunged_at = now()
    FROM chosen
    WHERE d.id = chosen.id AND d.expunged_at IS NULL
    RETURNING d.id
), answers_expunged AS (
    UPDATE {schema}.attempts AS a
    SET response_excerpt = NULL
    WHERE a.message_id IN (SELECT id FROM hot_expunged UNION ALL SELECT id FROM history_expunged)
      AND a.response_excerpt IS NOT NULL
), event_marked AS (
    UPDATE {schema}.events AS e
    SET expunged_at = now()
    FROM event_current AS event
    WHERE e.tenant_id = event.tenant_id AND e.event_key = event.event_key
      AND e.expunged_at IS NULL
), old_event_marked AS (
    UPDATE {schema}.events_old AS e
    SET expunged_at = now()
    FROM event_old AS event
    WHERE e.tenant_id = event.tenant_id AND e.event_key = event.event_key
      AND e.expunged_at IS NULL
), counts AS (
    SELECT (SELECT count(*) FROM hot_expunged) AS messages,
           (SELECT count(*) FROM history_expunged) AS history,
           (SELECT count(*) FROM hot WHERE state IN ('ready', 'paused')) AS cancelled,
           (SELECT count(*) FROM hot WHERE state = 'running') AS running,
           EXISTS (SELECT FROM event) AS event_found
), recorded AS (
    INSERT INTO {schema}.expunges (scope, selector, messages, history, cancelled, running)
    SELECT %(scope)s, CAST(%(selector)s AS jsonb), messages, history, cancelled, running
    FROM counts
    -- an event key with no record changes nothing, and is not recorded
    WHERE CAST(%(event_key)s AS text) IS NULL OR counts.event_found
    RETURNING id
)
SELECT c.messages, c.history, c.cancelled, c.running, c.event_found,
       (SELECT id FROM recorded) AS expunge_id
FROM counts AS c
