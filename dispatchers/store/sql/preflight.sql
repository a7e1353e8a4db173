-- The checks a dispatcher makes at start-up (dispatchers.store.preflight), before
-- it claims anything. It also reads the versions applied to the schema, with the
-- library's "migrations_applied" (sql/queries/migrate.sql).
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- name: preflight_schema
-- At start-up (dispatchers.store.preflight): does the schema exist, may this role use
-- it, and may it read the versions applied to it (NULL when the schema has no
-- schema_migrations table: never migrated). Tables are looked up only where the
-- role has USAGE on the schema: a lookup there without it is an error.
SELECT ns.oid IS NOT NULL AS schema_exists,
       COALESCE(ns.usable, false) AS usable,
       CASE WHEN ns.usable THEN has_table_privilege(
                to_regclass(quote_ident(%(schema)s) || '.schema_migrations'), 'SELECT')
       END AS versions_readable,
       current_user AS role
FROM (SELECT n.oid, has_schema_privilege(n.oid, 'USAGE') AS usable
      FROM (SELECT CAST(to_regnamespace(quote_ident(%(schema)s)) AS oid) AS oid) AS n) AS ns

-- name: preflight_privileges
-- At start-up, on a migrated schema: of the table privileges a dispatcher needs
-- (given in order: dispatchers.store.preflight takes them from outbox.roles, where they
-- are listed once, with why), those the current role lacks, one row each; then
-- the functions it executes (the alerts it raises) that it may not.
-- SELECT, INSERT and UPDATE may be granted on some columns only (outbox roles
-- grants the dispatcher UPDATE on the endpoints' health columns alone): any
-- column counts here, and a statement that needs another one fails when it runs.
SELECT table_name, privilege
FROM (
    SELECT needed.table_name, needed.privilege, needed.n
    FROM unnest(CAST(%(tables)s AS text[]), CAST(%(privileges)s AS text[]))
        WITH ORDINALITY AS needed(table_name, privilege, n)
    CROSS JOIN LATERAL (
        SELECT to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(needed.table_name))
            AS oid
    ) AS tbl
    WHERE NOT COALESCE(
        CASE WHEN needed.privilege = 'DELETE'
            THEN has_table_privilege(tbl.oid, needed.privilege)
            ELSE has_any_column_privilege(tbl.oid, needed.privilege)
        END, false)
    UNION ALL
    SELECT f.name, 'EXECUTE', cardinality(CAST(%(tables)s AS text[])) + f.n
    FROM unnest(CAST(%(functions)s AS text[])) WITH ORDINALITY AS f(name, n)
    WHERE NOT COALESCE(has_function_privilege(
        CAST(to_regproc(quote_ident(%(schema)s) || '.' || quote_ident(f.name)) AS oid),
        'EXECUTE'), false)
) AS lacking
ORDER BY n

-- name: preflight_secret_keys
-- The keys that seal signing secrets still in force, client keys and
-- endpoints' credentials: a dispatcher must hold each.
SELECT key_id
FROM {schema}.endpoint_secrets
WHERE key_id IS NOT NULL AND (expires_at IS NULL OR expires_at > now())
UNION
SELECT client_key_id
FROM {schema}.endpoints
WHERE client_key_id IS NOT NULL
UNION
SELECT auth_key_id
FROM {schema}.endpoints
WHERE auth_key_id IS NOT NULL
ORDER BY key_id
