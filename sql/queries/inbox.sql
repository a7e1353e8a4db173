-- The receiving half's inbox of processed keys (outbox.receiver.Inbox), in the
-- receiver's own database; "{schema}" is the inbox's schema. Creating it also
-- runs table_exists and schema_create (migrate.sql).

-- name: inbox_lock
-- IF NOT EXISTS alone races on the catalogs: serialize creators first.
SELECT pg_advisory_xact_lock(CAST(%(lock)s AS bigint))

-- name: inbox_create_table
CREATE TABLE IF NOT EXISTS {schema}.inbox (
    key         text        PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now()
)

-- name: inbox_claim
-- A concurrent claim of the same key waits here until the first one's
-- transaction ends: then it inserts (rolled back) or returns no row (committed).
INSERT INTO {schema}.inbox (key) VALUES (%(key)s)
ON CONFLICT (key) DO NOTHING
RETURNING 1

-- name: inbox_purge
-- A bounded batch of the oldest keys, found in heap order (oldest first for an
-- append-only table) so that no index on received_at is needed.
WITH gone AS (
    DELETE FROM {schema}.inbox
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {schema}.inbox
        WHERE received_at < now() - make_interval(secs => %(older_than_s)s)
        LIMIT %(limit)s))
    RETURNING 1
)
SELECT count(*) FROM gone
