-- Links to the consumer portal: pages where a tenant's own users manage that
-- tenant's endpoints and see its deliveries (dispatchers/portal), and nothing
-- of any other tenant.
--
-- A link carries a random token; only its SHA-256 digest is stored, so whoever
-- reads this table (a backup, a replica) cannot open a link. A link works until
-- it expires or is revoked; deleting the tenant deletes its links.
CREATE TABLE portal_links (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CHECK (expires_at > created_at)
);

-- a tenant's links: revoking them all, forgetting those long expired
CREATE INDEX portal_links_tenant_idx ON portal_links (tenant_id, expires_at);
