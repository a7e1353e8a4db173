-- 0015: TLS per endpoint: a CA bundle, and a client certificate for mutual TLS.
--
-- ca_bundle holds PEM certificates the endpoint's deliveries verify against
-- instead of the system's roots (NULL: the system's). client_cert holds the
-- client certificate (PEM, with its chain) and client_key its private key:
-- sealed under the key client_key_id names, as signing secrets are (see
-- 0008), or plain text when client_key_id is NULL. Existing endpoints get
-- none of them and deliver as before.
ALTER TABLE endpoints
    ADD COLUMN ca_bundle text,
    ADD COLUMN client_cert text,
    ADD COLUMN client_key text,
    ADD COLUMN client_key_id text CHECK (client_key_id ~ '^[0-9a-f]{16}$'),
    ADD CONSTRAINT endpoints_client_cert_with_key
        CHECK ((client_cert IS NULL) = (client_key IS NULL)),
    ADD CONSTRAINT endpoints_client_key_id_with_key
        CHECK (client_key_id IS NULL OR client_key IS NOT NULL);
