-- The migrations runner's own bookkeeping (outbox.migrations): the lock that
-- serialises runners, and the table of applied versions in "{schema}".
-- schema_exists, schema_create and table_exists serve the receiver's inbox too.

-- name: migrate_lock_timeout
-- Another runner may hold the lock for as long as its migration takes.
SET LOCAL lock_timeout = '60s'

-- name: migrate_lock
SELECT pg_advisory_xact_lock(%(key)s)

-- name: schema_exists
-- Asked before "schema_create": PostgreSQL checks the privilege to create a
-- schema in the database before IF NOT EXISTS, so a role that owns its schema
-- but may create none (as on a managed service) must not ask for one.
SELECT to_regnamespace(quote_ident(%(schema)s)) IS NOT NULL

-- name: schema_create
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: migrations_create
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_checksum
SELECT checksum FROM {schema}.schema_migrations WHERE version = %(version)s

-- name: migrate_search_path
-- The migration files name no schema: they create their objects in this one.
SET LOCAL search_path TO {schema}

-- name: migration_record
INSERT INTO {schema}.schema_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: table_exists
-- Also the inbox's (outbox.receiver): whether a table exists, without the
-- privileges that creating it would need.
SELECT to_regclass(%(table)s) IS NOT NULL

-- name: migrations_applied
SELECT version FROM {schema}.schema_migrations ORDER BY version
