-- 0024: tenants, the customers of a product that sends them webhooks.
--
-- A tenant is named by an id its product chooses ("customer-17", external_id)
-- and owns endpoints; an endpoint belongs to at most one tenant, and one with
-- none belongs to the operator (every endpoint made before this migration).
-- publish with a tenant fans out to that tenant's endpoints only; publish
-- without one, to the endpoints with none. A tenant's endpoints never receive
-- an event published for nobody or for another tenant.
--
-- The fan-out reads endpoints_fanout_idx: one probe of the tenant's key (0 for
-- none, so that one generic plan serves both), then that tenant's enabled
-- endpoints only. Its cost depends on the endpoints of the tenant, not on how
-- many there are in all.
--
-- A tenant's rate limit and retry schedule are the defaults of the endpoints
-- added to it (copied at creation, as an operator would type them): each
-- endpoint keeps its own policy, read by the claim from its own row.
--
-- An event key is the tenant's own: two customers may each publish "order-1".
-- events is keyed by (tenant_id, event_key), tenant_id 0 for none; the primary
-- key index is rebuilt, which holds the events table's lock while it builds.
CREATE TABLE tenants (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    external_id       text NOT NULL UNIQUE
        CHECK (external_id ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    name              text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    rate_limit_per_s  rate_limit,
    rate_burst        slot_number,
    retry_schedule    retry_schedule,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit_per_s IS NULL) = (rate_burst IS NULL))
);

ALTER TABLE endpoints ADD COLUMN tenant_id bigint REFERENCES tenants (id);

CREATE INDEX endpoints_fanout_idx ON endpoints ((COALESCE(tenant_id, 0)), id) WHERE enabled;
-- every endpoint of a tenant, enabled or not (its pages, its deletion)
CREATE INDEX endpoints_tenant_idx ON endpoints (tenant_id, id) WHERE tenant_id IS NOT NULL;

ALTER TABLE events ADD COLUMN tenant_id bigint NOT NULL DEFAULT 0;
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events ADD PRIMARY KEY (tenant_id, event_key);
