-- Delivery attempts as the web surfaces show them. %(tenant_id)s scopes every
-- statement: NULL is the operator; a tenant's row id keeps to the attempts of
-- the messages of its endpoints, and hides which dispatcher made each (owner).

-- fragment: attempt_shown
-- An attempt as shown: its error and the excerpt of the receiver's reply as
-- recorded (a page shows the start of each).
SELECT a.message_id, a.attempt,
       CASE WHEN CAST(%(tenant_id)s AS bigint) IS NULL THEN a.owner END AS owner,
       a.started_at, a.duration_ms, a.status, a.outcome, a.error_class,
       a.error, a.response_excerpt
FROM {schema}.attempts AS a

-- name: web_message_attempts
-- The attempts of message %(id)s in scope, in order (the attempts' primary
-- key); none for another's.
{attempt_shown}
WHERE a.message_id = %(id)s
  AND (CAST(%(tenant_id)s AS bigint) IS NULL
       OR EXISTS (SELECT 1 FROM {schema}.messages AS m
                  JOIN {schema}.endpoints AS e ON e.id = m.endpoint_id
                  WHERE m.id = %(id)s AND e.tenant_id = CAST(%(tenant_id)s AS bigint))
       OR EXISTS (SELECT 1 FROM {schema}.delivered AS d
                  JOIN {schema}.endpoints AS e ON e.id = d.endpoint_id
                  WHERE d.id = %(id)s AND e.tenant_id = CAST(%(tenant_id)s AS bigint)))
ORDER BY a.attempt

-- name: web_endpoint_attempts
-- The latest attempts of the last hour of endpoint %(endpoint_id)s in scope,
-- newest first (a range scan of attempts_started_idx), each matched to its
-- message in the hot table or in the history; a delivered message with an
-- attempt in the last hour completed in it, so the history is read over one
-- hour of delivered_endpoint_idx, never the endpoint's whole past.
{attempt_shown}
WHERE a.started_at >= now() - interval '1 hour'
  AND (EXISTS (SELECT 1 FROM {schema}.messages AS m
               WHERE m.id = a.message_id AND m.endpoint_id = %(endpoint_id)s)
       OR EXISTS (SELECT 1 FROM {schema}.delivered AS d
                  WHERE d.id = a.message_id AND d.endpoint_id = %(endpoint_id)s
                    AND d.completed_at >= now() - interval '1 hour'))
  AND (CAST(%(tenant_id)s AS bigint) IS NULL
       OR EXISTS (SELECT 1 FROM {schema}.endpoints AS e
                  WHERE e.id = %(endpoint_id)s
                    AND e.tenant_id = CAST(%(tenant_id)s AS bigint)))
ORDER BY a.started_at DESC
LIMIT %(limit)s
