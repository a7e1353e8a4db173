-- What the dashboard reads that sql/queries/ui.sql does not have yet: one page of
-- the endpoints list. Loaded by dispatchers.ui.store, with {schema} bound as
-- the library's statements are.

-- name: ui_endpoint_page
-- One page of the endpoints list: up to %(limit)s endpoints after id %(after)s,
-- by id (keyset: a range scan of endpoints_pkey, as cheap on the last page as on
-- the first), only those that need attention when %(attention)s is true
-- (disabled, failing, or with dead messages). Each with its first event types
-- (the page says how many there are), the start of why it was disabled, its
-- signing secrets that still sign as stored (sealed or not: the dashboard opens
-- them if it holds the key), and its messages pending and dead, counted on
-- messages_endpoint_idx for this page's endpoints only.
SELECT e.id, e.url, e.description, e.event_types[1:%(types)s] AS event_types,
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
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE m.state IN ('ready', 'running', 'paused')) AS pending,
           count(*) FILTER (WHERE m.state = 'dead') AS dead
    FROM {schema}.messages AS m
    WHERE m.endpoint_id = e.id
) AS c
WHERE e.id > %(after)s
  AND (NOT %(attention)s OR NOT e.enabled OR e.failure_streak > 0 OR c.dead > 0)
ORDER BY e.id
LIMIT %(limit)s

-- name: ui_sealed_secrets
-- Whether any signing secret is sealed: then a secret rotated without a key
-- would be the one stored in plain text.
SELECT EXISTS (SELECT 1 FROM {schema}.endpoint_secrets WHERE key_id IS NOT NULL) AS sealed
