-- 0023: an endpoint's own credentials: static headers, HTTP basic, a bearer
-- token, or OAuth2 client credentials (the token is fetched by the dispatcher).
--
-- "auth" holds every credential of the endpoint as one JSON value, sealed under
-- the key auth_key_id names, as signing secrets are (see 0008), or plain text
-- when auth_key_id is NULL: the static headers with their values, the basic
-- user and password, the bearer token, or the OAuth2 client's token URL, id,
-- secret, scope and audience. It is what the dispatcher sends with; sealed, it
-- binds the secrets to where they go (a token URL changed by hand does not
-- open), and one value means one AES-GCM operation per endpoint and one column
-- for a rekey, the start-up check and status to cover.
--
-- The other columns say what an operator may see of it, written with it by the
-- same statement: the names of the static headers (never their values), which
-- scheme sets Authorization, the basic user, and the OAuth2 client's token URL,
-- id, scope and audience. Existing endpoints get none and deliver as before.
ALTER TABLE endpoints
    ADD COLUMN auth text,
    ADD COLUMN auth_key_id text CHECK (auth_key_id ~ '^[0-9a-f]{16}$'),
    ADD COLUMN auth_scheme text CHECK (auth_scheme IN ('basic', 'bearer', 'oauth2')),
    ADD COLUMN auth_header_names text[] NOT NULL DEFAULT '{}',
    ADD COLUMN basic_username text,
    ADD COLUMN oauth2_token_url text,
    ADD COLUMN oauth2_client_id text,
    ADD COLUMN oauth2_scope text,
    ADD COLUMN oauth2_audience text,
    ADD CONSTRAINT endpoints_auth_with_credentials
        CHECK ((auth IS NULL) = (auth_scheme IS NULL AND cardinality(auth_header_names) = 0)),
    ADD CONSTRAINT endpoints_auth_key_id_with_auth
        CHECK (auth_key_id IS NULL OR auth IS NOT NULL),
    ADD CONSTRAINT endpoints_basic_username_with_basic
        CHECK ((basic_username IS NOT NULL) = (auth_scheme IS NOT DISTINCT FROM 'basic')),
    ADD CONSTRAINT endpoints_oauth2_client_with_oauth2
        CHECK ((oauth2_token_url IS NOT NULL AND oauth2_client_id IS NOT NULL)
               = (auth_scheme IS NOT DISTINCT FROM 'oauth2')),
    ADD CONSTRAINT endpoints_oauth2_options_with_oauth2
        CHECK ((oauth2_scope IS NULL AND oauth2_audience IS NULL)
               OR auth_scheme IS NOT DISTINCT FROM 'oauth2');
