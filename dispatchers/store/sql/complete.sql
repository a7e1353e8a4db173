-- What ends a message's run (dispatchers.store.postgres): "complete" and
-- "complete_delivered" write a batch of outcomes, "recorded_attempts" tells after
-- a lost answer which were written, and "rescue" ends the runs whose lease
-- expired. Completion and rescue pass on the concurrency slots of the requests
-- they end ("slots_passed"), which is why rescue is here and not with the
-- renewal of leases (leases.sql): a fragment is included only in its own file.
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- fragment: slots_passed
-- The concurrency slots of the messages in "ending" (ids whose requests ended or
-- were given back): each passes to a request in flight to its destination that
-- holds none (listed in unseated_requests, lowest id first), else is freed; and
-- the ending messages leave that list. So a destination's free slots stay its
-- cap less its requests in flight (migration 0021). The list's rows are locked
-- SKIP LOCKED, so that two completions never seat the same request. A slot freed
-- while someone waits (a list row locked elsewhere, or written by a cap change
-- this statement cannot see yet) is not taken by a claim ("cap_free") until the
-- list is empty: the destination may run below its cap for a while, never above.
-- The CTEs "vacated", "heirs", "freed" and "unlisted"; they need the CTE
-- "ending" (id).
vacated AS (
    SELECT s.destination, s.slot,
           row_number() OVER (PARTITION BY s.destination ORDER BY s.slot) AS n
    FROM {schema}.destination_slots AS s
    WHERE s.message_id IN (SELECT id FROM ending)
), heirs AS (
    SELECT w.destination, w.message_id,
           row_number() OVER (PARTITION BY w.destination ORDER BY w.message_id) AS n
    FROM (SELECT u.destination, u.message_id
          FROM {schema}.unseated_requests AS u
          WHERE u.destination IN (SELECT destination FROM vacated)
            AND u.message_id NOT IN (SELECT id FROM ending)
          FOR UPDATE SKIP LOCKED) AS w
), freed AS (
    UPDATE {schema}.destination_slots AS s
    SET message_id = h.message_id
    FROM vacated AS v
    LEFT JOIN heirs AS h USING (destination, n)
    WHERE s.destination = v.destination AND s.slot = v.slot
      AND s.message_id IN (SELECT id FROM ending)
    RETURNING h.message_id AS seated
), unlisted AS (
    DELETE FROM {schema}.unseated_requests AS u
    WHERE u.message_id IN (SELECT id FROM ending)
       OR u.message_id IN (SELECT seated FROM freed)
)

-- name: complete
-- Write a batch of outcomes in one statement. Every write is fenced by owner,
-- attempt number and state, so an owner whose lease expired (and whose message
-- was claimed again, even by itself) changes nothing. Delivered messages move to
-- the history table; the others go back to ready (with their delay), to dead, or
-- are released (unsent, the attempt refunded; one held with an error, such as a
-- destination the SSRF guard refused, records it as the last error). Attempt rows
-- are written only for fenced-in outcomes that sent a request. Returns the ids
-- whose outcome was applied.
WITH outcome AS (
    SELECT *
    FROM unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(endpoint_ids)s AS bigint[]),
        CAST(%(attempts)s AS integer[]),
        CAST(%(states)s AS text[]),
        CAST(%(delays)s AS double precision[]),
        CAST(%(sent)s AS boolean[]),
        CAST(%(statuses)s AS integer[]),
        CAST(%(outcomes)s AS text[]),
        CAST(%(error_classes)s AS text[]),
        CAST(%(errors)s AS text[]),
        CAST(%(started)s AS timestamptz[]),
        CAST(%(durations)s AS integer[]),
        CAST(%(excerpts)s AS text[])
    ) AS o(id, endpoint_id, attempt, state, delay_s, sent, status, outcome, error_class,
           error, started_at, duration_ms, excerpt)
), health AS (
    -- Endpoint health: per endpoint in this batch, did any attempt succeed, did
    -- any fail, did one answer 410 Gone.
    SELECT endpoint_id,
           bool_or(outcome = 'delivered') AS any_success,
           count(*) FILTER (WHERE sent AND outcome IN ('retry', 'failed', 'gone')) AS failures,
           bool_or(outcome = 'gone') AS gone
    FROM outcome
    WHERE endpoint_id IS NOT NULL
    GROUP BY endpoint_id
), endpoint_update AS (
    -- A success clears the failure streak; failures extend it. 410 Gone disables
    -- the endpoint at once; failing without a success for disable_after disables
    -- it too. Successes on a healthy endpoint skip the write (hot endpoints would
    -- otherwise serialise every flush on their row).
    UPDATE {schema}.endpoints AS e
    SET failure_streak = CASE WHEN h.any_success THEN 0 ELSE e.failure_streak + h.failures END,
        failing_since = CASE WHEN h.any_success THEN NULL
                             ELSE COALESCE(e.failing_since, now()) END,
        last_success_at = CASE WHEN h.any_success THEN now() ELSE e.last_success_at END,
        enabled = e.enabled AND NOT h.gone AND NOT (
            NOT h.any_success
            AND COALESCE(e.failing_since, now()) < now() - make_interval(secs => %(disable_after_s)s)),
        disabled_reason = CASE
            WHEN NOT e.enabled THEN e.disabled_reason
            WHEN h.gone THEN 'the endpoint answered 410 Gone'
            WHEN NOT h.any_success
                 AND COALESCE(e.failing_since, now()) < now() - make_interval(secs => %(disable_after_s)s)
                THEN 'every attempt failed since ' || to_char(e.failing_since, 'YYYY-MM-DD HH24:MI:SS TZ')
            END,
        disabled_at = CASE WHEN NOT e.enabled THEN e.disabled_at
                           WHEN h.gone OR (NOT h.any_success
                                AND COALESCE(e.failing_since, now())
                                    < now() - make_interval(secs => %(disable_after_s)s))
                           THEN now() END,
        updated_at = now()
    FROM health AS h
    -- by primary key, from an array, as in "claim": joined to "health" alone, the
    -- plan may read every endpoint into a hash at each flush
    WHERE e.id = ANY (ARRAY(SELECT endpoint_id FROM health))
      AND e.id = h.endpoint_id
      AND (h.gone OR NOT h.any_success OR NOT e.enabled OR e.failure_streak > 0
           OR e.last_success_at IS NULL OR e.last_success_at <= now() - interval '10 seconds')
    RETURNING e.id, e.enabled, e.disabled_at = now() AS newly_disabled, e.disabled_reason
), disabled AS (
    SELECT id FROM endpoint_update WHERE NOT enabled
), paused AS (
    -- Pause the waiting messages of endpoints disabled by this batch.
    UPDATE {schema}.messages AS m
    SET state = 'paused'
    FROM disabled
    WHERE m.endpoint_id = disabled.id AND m.state = 'ready'
), done AS (
    -- One primary key lookup per outcome. The state is compared with a
    -- sub-select, not a constant, so that the planner cannot walk the partial
    -- lease index instead (every running row of every dispatcher, for each
    -- outcome), as it does when its statistics say that nothing runs.
    DELETE FROM {schema}.messages AS m
    USING outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running') AND o.state = 'delivered'
    RETURNING m.*, o.status AS final_status
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts, final_status,
           created_at, now()
    FROM done
), updated AS (
    -- A webhook whose endpoint was deleted while it was in flight (the delete set
    -- its endpoint_id to NULL) is dead like the endpoint's waiting messages, never
    -- retried: it would go unsigned to the deleted endpoint's URL.
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN o.state = 'ready' AND m.endpoint_id IS NULL
                          AND starts_with(m.target, 'endpoint:') THEN 'dead'
                     WHEN o.state = 'ready' AND m.endpoint_id IN (SELECT id FROM disabled)
                     THEN 'paused' ELSE o.state END,
        attempts = CASE WHEN o.sent THEN m.attempts ELSE m.attempts - 1 END,
        available_at = CASE WHEN o.state = 'ready'
                            THEN now() + make_interval(secs => o.delay_s)
                            ELSE m.available_at END,
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN o.state = 'ready' AND m.endpoint_id IS NULL
                               AND starts_with(m.target, 'endpoint:') THEN 'endpoint deleted'
                          WHEN o.sent THEN o.error
                          -- held unsent (secrets unavailable, destination refused):
                          -- why, for "messages show"; a plain release keeps the last
                          ELSE COALESCE(o.error, m.last_error) END,
        last_status = CASE WHEN o.sent THEN o.status ELSE m.last_status END,
        completed_at = CASE WHEN o.state = 'dead'
                              OR (m.endpoint_id IS NULL AND starts_with(m.target, 'endpoint:'))
                            THEN now() END
    FROM outcome AS o
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running') AND o.state <> 'delivered'  -- as in done
    RETURNING m.id
), applied AS (
    SELECT id FROM done
    UNION ALL
    SELECT id FROM updated
), ending AS (
    SELECT id FROM applied
), {slots_passed}, recorded AS (
    INSERT INTO {schema}.attempts (
        message_id, attempt, owner, started_at, duration_ms, status, outcome,
        error_class, error, response_excerpt
    )
    SELECT o.id, o.attempt, %(owner)s, o.started_at, o.duration_ms, o.status, o.outcome,
           o.error_class, o.error, o.excerpt
    FROM outcome AS o
    JOIN applied USING (id)
    WHERE o.sent
)
SELECT id, NULL AS disabled_endpoint, NULL AS reason FROM applied
UNION ALL
SELECT NULL, id, disabled_reason FROM endpoint_update WHERE newly_disabled

-- name: complete_delivered
-- "complete" for the common batch, every outcome a sent success: no retry to
-- schedule, no message to kill, no endpoint to disable. It writes what
-- "complete" writes for such a batch, fenced the same way, with the same result
-- rows, and costs about half as much to plan and less to run.
WITH done AS (
    DELETE FROM {schema}.messages AS m
    USING unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(attempts)s AS integer[]),
        CAST(%(statuses)s AS integer[]),
        CAST(%(outcomes)s AS text[]),
        CAST(%(error_classes)s AS text[]),
        CAST(%(errors)s AS text[]),
        CAST(%(started)s AS timestamptz[]),
        CAST(%(durations)s AS integer[]),
        CAST(%(excerpts)s AS text[])
    ) AS o(id, attempt, status, outcome, error_class, error, started_at, duration_ms, excerpt)
    -- one primary key lookup per outcome, as in "complete"
    WHERE m.id = o.id AND m.attempts = o.attempt AND m.lease_owner = %(owner)s
      AND m.state = (SELECT 'running')
    RETURNING m.*, o.status AS final_status, o.outcome, o.error_class, o.error,
              o.started_at, o.duration_ms, o.excerpt
), history AS (
    INSERT INTO {schema}.delivered (
        id, idempotency_key, target, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, attempts, max_attempts, last_status,
        created_at, completed_at
    )
    SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,
           content_type, event_type, ordering_key, attempts, max_attempts, final_status,
           created_at, now()
    FROM done
), recorded AS (
    INSERT INTO {schema}.attempts (
        message_id, attempt, owner, started_at, duration_ms, status, outcome,
        error_class, error, response_excerpt
    )
    SELECT id, attempts, %(owner)s, started_at, duration_ms, final_status, outcome,
           error_class, error, excerpt
    FROM done
), endpoint_update AS (
    -- A success clears its endpoint's failure streak; a disabled endpoint stays
    -- disabled. Skipped on a healthy endpoint, as in "complete".
    UPDATE {schema}.endpoints AS e
    SET failure_streak = 0,
        failing_since = NULL,
        last_success_at = now(),
        disabled_reason = CASE WHEN NOT e.enabled THEN e.disabled_reason END,
        disabled_at = CASE WHEN NOT e.enabled THEN e.disabled_at END,
        updated_at = now()
    WHERE e.id = ANY (CAST(%(endpoint_ids)s AS bigint[]))
      AND (NOT e.enabled OR e.failure_streak > 0
           OR e.last_success_at IS NULL OR e.last_success_at <= now() - interval '10 seconds')
    RETURNING e.id, e.enabled
), paused AS (
    -- the waiting messages of an endpoint disabled meanwhile, as in "complete"
    UPDATE {schema}.messages
    SET state = 'paused'
    WHERE endpoint_id = ANY (ARRAY(SELECT id FROM endpoint_update WHERE NOT enabled))
      AND state = 'ready'
), ending AS (
    SELECT id FROM done
), {slots_passed}
SELECT id, NULL AS disabled_endpoint, NULL AS reason FROM done

-- name: recorded_attempts
-- Which of these sent outcomes an earlier try of the same write recorded: the
-- dispatcher asks after a write whose answer was lost and whose retry matched
-- nothing. A lease the rescuer took over has an attempt row too, but with the
-- outcome 'lease_expired', which no sent outcome has.
SELECT a.message_id
FROM unnest(
    CAST(%(ids)s AS bigint[]),
    CAST(%(attempts)s AS integer[]),
    CAST(%(outcomes)s AS text[])
) AS o(id, attempt, outcome)
JOIN {schema}.attempts AS a ON a.message_id = o.id AND a.attempt = o.attempt
WHERE a.owner = %(owner)s AND a.outcome = o.outcome

-- name: rescue
-- Return messages whose lease expired (their dispatcher died, froze or lost the
-- database) to ready, or to dead when their attempts are spent. Walks the lease
-- index; SKIP LOCKED keeps concurrent rescuers and completions out of each
-- other's way. The lost attempt is recorded against the owner that held it.
-- A webhook whose endpoint was deleted meanwhile is dead, as in complete.
WITH expired AS (
    SELECT id, lease_owner, attempts,
           endpoint_id IS NULL AND starts_with(target, 'endpoint:') AS orphaned
    FROM {schema}.messages
    WHERE state = 'running' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.messages AS m
    SET state = CASE WHEN m.attempts >= m.max_attempts OR expired.orphaned THEN 'dead'
                     ELSE 'ready' END,
        available_at = now(),
        lease_owner = NULL,
        lease_until = NULL,
        last_error = CASE WHEN expired.orphaned THEN 'endpoint deleted'
                          ELSE 'lease expired: the dispatcher stopped renewing it' END,
        last_status = NULL,
        completed_at = CASE WHEN m.attempts >= m.max_attempts OR expired.orphaned
                            THEN now() END
    FROM expired
    WHERE m.id = expired.id
    RETURNING m.id, m.state
), recorded AS (
    INSERT INTO {schema}.attempts (message_id, attempt, owner, started_at, outcome, error_class, error)
    SELECT expired.id, expired.attempts, expired.lease_owner, now(), 'lease_expired',
           'lease_expired', 'lease expired: the dispatcher stopped renewing it'
    FROM expired
    JOIN rescued USING (id)
    -- informational only: never let a stray row stop the rescue of the rest.
    -- Not ON CONFLICT: attempts is partitioned by started_at (migration 0032),
    -- and its primary keys are per partition, so no arbiter index covers the
    -- table. The check is as good here: the message's row lock (taken above)
    -- keeps the only other writer of its attempt row, its completion, out until
    -- we commit, and then its fence finds the lease gone.
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.attempts AS a
        WHERE a.message_id = expired.id AND a.attempt = expired.attempts)
), ending AS (
    -- rescued messages, and any other that holds a slot or waits for one and is
    -- no longer running (ended by a statement that frees no slot). One primary
    -- key probe per row: a NOT EXISTS here may be planned as a hash of every
    -- running message, built at each rescue once any slot is held.
    SELECT id FROM rescued
    UNION
    SELECT s.message_id
    FROM {schema}.destination_slots AS s
    WHERE s.message_id IS NOT NULL
      AND (SELECT m.state FROM {schema}.messages AS m WHERE m.id = s.message_id)
          IS DISTINCT FROM 'running'
    UNION
    SELECT u.message_id
    FROM {schema}.unseated_requests AS u
    WHERE (SELECT m.state FROM {schema}.messages AS m WHERE m.id = u.message_id)
          IS DISTINCT FROM 'running'
), {slots_passed}
SELECT id, state FROM rescued
