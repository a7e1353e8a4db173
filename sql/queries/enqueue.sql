-- What an application runs inside its own transaction: enqueue and publish.
--
-- Loaded by outbox._queries: "{schema}" becomes the quoted schema identifier and
-- "{notify}" is empty in a statement and the wake-up call in its "_notify" twin;
-- parameters use psycopg's %(name)s style (translated for SQLAlchemy's text()).

-- fragment: ordered
-- Messages of one ordering key are delivered in id order; for that to be the
-- order in which their transactions commit, a producer of a key takes a
-- transaction-scoped advisory lock on it (per schema) before it draws an id,
-- so a second producer of the key waits here until the first commits or rolls
-- back. Without an ordering key the WHERE is false: no lock, nothing to wait
-- for. The statements below draw their ids from a row of
-- "SELECT count(*) FROM ordered", which exists only once this has run.
ordered AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended(k.ordering_key, hashtext('{schema}')))
    FROM (SELECT CAST(%(ordering_key)s AS text) AS ordering_key) AS k
    WHERE k.ordering_key IS NOT NULL
)

-- fragment: keys_current
-- True under READ COMMITTED, at the cost of reading a setting: a statement
-- locks its tables before it takes its snapshot, so it sees the generation of
-- keys as it is (migration 0033). Under REPEATABLE READ or SERIALIZABLE,
-- _keys_moved raises serialization_failure if the generation turned since the
-- transaction's snapshot (which may miss keys of the previous one).
(current_setting('transaction_isolation') = 'read committed' OR NOT {schema}._keys_moved())

-- name: enqueue
-- trace_context is the enqueuing span's W3C context (outbox/_tracing.py), or NULL.
-- Insert the key first: if (target, key) exists already, in the current
-- generation of keys or the previous one (migration 0033, which says why the
-- look-up of the previous one cannot miss a key), the key insert does nothing,
-- so the message insert (which selects from it) does nothing too, and the
-- caller looks the existing id up with enqueue_existing. A concurrent
-- transaction holding the same key makes this statement wait for its outcome.
-- keys_current is the check of the generation under REPEATABLE READ.
-- The key keeps the digest of its request (outbox/_digest.py, computed by the
-- library, so it costs the database nothing), which enqueue_existing returns
-- for the caller to tell a retry from a key reused for another request.
-- {notify} is either empty or a pg_notify call with a constant payload (so that
-- PostgreSQL folds all notifications of one transaction into one), made only
-- when a dispatcher is waiting for it (outbox._queries.Queries explains how).
WITH {ordered}, new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id, digest)
    SELECT %(target)s, %(idempotency_key)s, nextval('{schema}.messages_id_seq'), %(digest)s
    FROM (SELECT count(*) FROM ordered) AS after_lock
    WHERE NOT {schema}.key_taken_before(%(target)s, %(idempotency_key)s)
      AND {keys_current}
    -- the primary key (target, idempotency_key), the table's one unique index:
    -- named, it would need the producer to read those columns (0034)
    ON CONFLICT DO NOTHING
    RETURNING message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts, available_at,
        trace_context
    )
    SELECT new_key.message_id,
           CAST(%(idempotency_key)s AS text), CAST(%(target)s AS text),
           CAST(%(destination)s AS text),
           CAST(%(endpoint_id)s AS bigint), CAST(%(url)s AS text),
           CAST(%(method)s AS text), CAST(%(headers)s AS jsonb), CAST(%(body)s AS bytea),
           CAST(%(content_type)s AS text), CAST(%(event_type)s AS text),
           CAST(%(ordering_key)s AS text), CAST(%(state)s AS text),
           CAST(%(max_attempts)s AS integer),
           COALESCE(CAST(%(available_at)s AS timestamptz), now()),
           CAST(%(trace_context)s AS jsonb)
    FROM new_key
    RETURNING id
)
SELECT id{notify} FROM new_message

-- name: enqueue_existing
-- Runs as a separate statement after a conflict, so that in READ COMMITTED it
-- sees the row that the concurrent transaction committed. A NULL digest is a
-- key written before digests were kept (migration 0007): it accepts any request.
-- A key in both generations was carried (0033): the same message. Read by
-- key_lookup, as the owner: the producer may read no key but its own (0034).
SELECT message_id AS id, digest
FROM {schema}.key_lookup(%(target)s, %(idempotency_key)s)

-- name: publish
-- Fan one event out to every enabled endpoint subscribed to its type, in the
-- caller's transaction, once per event key. A subscription is an exact type or
-- a "prefix.*" pattern; an endpoint with none gets every type.
--
-- The event row is inserted first, with the ids its messages will have; the
-- keys and messages are written only if it was (new_event has a row). So an
-- event key published again writes nothing, whatever endpoints subscribed
-- since, and the one row returned carries the ids the first publish recorded,
-- and its digest (type and payload, outbox/_digest.py) for the caller to
-- compare. A concurrent transaction publishing the same key makes the event
-- insert wait for its outcome; if it committed, its row is not in this
-- statement's snapshot, the row returned has neither created_ids nor
-- existing_ids, and the caller reads the event with publish_existing (as
-- enqueue does with enqueue_existing).
--
-- Each endpoint's message is keyed "<event key>:<endpoint id>" (its webhook-id);
-- its destination is the endpoint ("endpoint:<id>", its target).
-- A key that exists without its event row (written before migration 0007, or
-- kept past the retention of its event while its message waits) keeps its
-- message: its id is recorded, and no second message is written for it.
-- nextval is taken on every publish, also one that writes nothing: ids may skip.
-- The event and each key are looked up in both generations (migration 0033);
-- found in the previous one, nothing is written, as for the current one.
--
-- An endpoint with a filter (on the payload, outbox/_filters.py) gets the event
-- only if its filter is among those the caller found the payload to pass
-- (matched). The caller cannot know the filters before this statement reads the
-- endpoints, so when a subscribed endpoint's filter is not among those it
-- judged (evaluated), nothing is written and the filters are returned
-- (unevaluated) for the caller to judge and publish again. Without filters, a
-- publish is this one statement; with them, two. A filter changed between the
-- two is returned again, never passed unjudged.
WITH tenant AS MATERIALIZED (
    -- 0 for no tenant; NULL for a tenant unknown here, which gets nothing
    SELECT CASE WHEN CAST(%(tenant)s AS text) IS NULL THEN 0
                ELSE (SELECT t.id FROM {schema}.tenants AS t
                      WHERE t.external_id = %(tenant)s) END AS id
), recorded AS MATERIALIZED (
    -- the event's record, if it was published before, in either generation
    SELECT e.message_ids, e.digest FROM {schema}.events AS e
    WHERE e.tenant_id = (SELECT id FROM tenant) AND e.event_key = %(event_key)s
    UNION ALL
    SELECT e.message_ids, e.digest FROM {schema}.events_old AS e
    WHERE e.tenant_id = (SELECT id FROM tenant) AND e.event_key = %(event_key)s
    LIMIT 1
), {ordered}, subscribed AS (
    SELECT e.id, e.filter,
           'endpoint:' || e.id AS target,
           %(event_key)s || ':' || e.id AS idempotency_key
    FROM {schema}.endpoints AS e
    WHERE e.enabled
      AND COALESCE(e.tenant_id, 0) = (SELECT id FROM tenant)
      AND (cardinality(e.event_types) = 0
           OR %(event_type)s = ANY (e.event_types)
           OR EXISTS (
                SELECT 1 FROM unnest(e.event_types) AS pattern
                WHERE right(pattern, 2) = '.*'
                  AND starts_with(%(event_type)s, left(pattern, -1))))
), unevaluated AS (
    SELECT DISTINCT filter
    FROM subscribed
    WHERE filter IS NOT NULL AND filter <> ALL (CAST(%(evaluated)s AS text[]))
), planned AS (
    SELECT s.id, s.target, s.idempotency_key, k.message_id IS NULL AS fresh,
           COALESCE(k.message_id, nextval('{schema}.messages_id_seq')) AS message_id
    FROM subscribed AS s
    CROSS JOIN (SELECT count(*) FROM ordered) AS after_lock
    -- a lookup of the key per endpoint, in either generation, by key_lookup
    -- (as the owner: the producer may read no key but its own, 0034)
    LEFT JOIN LATERAL {schema}.key_lookup(s.target, s.idempotency_key) AS k ON true
    WHERE s.filter IS NULL OR s.filter = ANY (CAST(%(matched)s AS text[]))
), new_event AS (
    INSERT INTO {schema}.events (tenant_id, event_key, event_type, digest, message_ids)
    SELECT tenant.id, %(event_key)s, %(event_type)s, CAST(%(digest)s AS bytea),
           ARRAY(SELECT message_id FROM planned ORDER BY message_id)
    FROM tenant
    WHERE tenant.id IS NOT NULL AND NOT EXISTS (SELECT FROM unevaluated)
      AND NOT EXISTS (SELECT FROM recorded) AND {keys_current}
    ON CONFLICT (tenant_id, event_key) DO NOTHING
    RETURNING message_ids
), new_key AS (
    INSERT INTO {schema}.message_keys (target, idempotency_key, message_id)
    SELECT target, idempotency_key, message_id
    FROM planned
    WHERE fresh AND EXISTS (SELECT FROM new_event)
    ORDER BY id
    ON CONFLICT DO NOTHING  -- the primary key (see enqueue)
    RETURNING message_id
), new_message AS (
    INSERT INTO {schema}.messages (
        id, idempotency_key, target, destination, endpoint_id, url, method, headers, body,
        content_type, event_type, ordering_key, state, max_attempts, trace_context
    )
    SELECT p.message_id, p.idempotency_key, p.target, p.target, p.id, NULL, 'POST',
           CAST('{{}}' AS jsonb), CAST(%(body)s AS bytea), 'application/json',
           CAST(%(event_type)s AS text), CAST(%(ordering_key)s AS text), 'ready',
           CAST(%(max_attempts)s AS integer), CAST(%(trace_context)s AS jsonb)
    FROM new_key AS k
    JOIN planned AS p USING (message_id)
)
SELECT n.message_ids AS created_ids, e.message_ids AS existing_ids,
       e.digest, ARRAY(SELECT filter FROM unevaluated) AS unevaluated,
       tenant.id IS NOT NULL AS tenant_known{notify}
FROM tenant
LEFT JOIN new_event AS n ON true
LEFT JOIN recorded AS e ON true

-- name: publish_existing
-- Runs as a separate statement after publish waited for a concurrent publish of
-- the same key, so that in READ COMMITTED it sees the event that one committed.
SELECT e.message_ids, e.digest
FROM (SELECT tenant_id, event_key, message_ids, digest FROM {schema}.events
      UNION ALL
      SELECT tenant_id, event_key, message_ids, digest FROM {schema}.events_old) AS e
WHERE e.tenant_id = COALESCE((SELECT t.id FROM {schema}.tenants AS t
                              WHERE t.external_id = %(tenant)s), 0)
  AND e.event_key = %(event_key)s
LIMIT 1
