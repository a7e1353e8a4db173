-- Least-privilege roles (outbox.roles): the roles that `outbox roles` grants to.
-- The grants themselves are built from parts in outbox/roles.py: their role and
-- table names vary with each call.

-- name: roles_lookup
-- Each named role as the server knows it: whether it exists, whether it is a
-- superuser (no grant restricts it), whether it owns the outbox schema.
SELECT wanted.name,
       r.oid IS NOT NULL AS found,
       COALESCE(r.rolsuper, false) AS superuser,
       COALESCE(r.oid = n.nspowner, false) AS owner
FROM unnest(CAST(%(names)s AS text[])) AS wanted(name)
LEFT JOIN pg_catalog.pg_roles AS r ON r.rolname = wanted.name
LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname = %(schema)s
