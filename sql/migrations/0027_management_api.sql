-- 0027: the management API's bearer tokens and its audit log (dispatchers.api).
--
-- A token is "obx_" and the base64url of 32 random bytes; only its SHA-256 is
-- stored (a token of that entropy needs no salt nor a slow hash: nothing short
-- of the token itself finds it from its digest), with the first characters
-- shown in listings so that an operator can tell tokens apart. A token's scope
-- is read (GET routes) or write (every route); one made for a tenant sees and
-- changes that tenant's endpoints and their messages only. Revoking a token
-- keeps its row, so that the audit log's entries still name who acted; deleting
-- a tenant deletes its tokens.
CREATE TABLE api_tokens (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    scope         text NOT NULL CHECK (scope IN ('read', 'write')),
    tenant_id     bigint REFERENCES tenants (id) ON DELETE CASCADE,
    token_sha256  bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    shown_prefix  text NOT NULL CHECK (shown_prefix ~ '^obx_[A-Za-z0-9_-]{4}$'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

-- Every write made through the API: who (the token's id, and its name as it
-- was then), what (an action on a resource), when, and fingerprints of the
-- resource before and after (SHA-256 of its fields that are not secret; NULL
-- where it did not exist, or for actions on many messages, whose detail says
-- what was selected and how many were changed). Never a secret value. Entries
-- are written in the transaction of the change they record, and only added.
CREATE TABLE audit_log (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    token_id        bigint NOT NULL,
    token_name      text NOT NULL,
    tenant_id       bigint,
    action          text NOT NULL,
    resource        text NOT NULL,
    resource_id     text,
    before_sha256   text CHECK (before_sha256 ~ '^[0-9a-f]{64}$'),
    after_sha256    text CHECK (after_sha256 ~ '^[0-9a-f]{64}$'),
    detail          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object')
);

