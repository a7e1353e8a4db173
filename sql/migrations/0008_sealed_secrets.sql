-- 0008: signing secrets sealed at rest.
--
-- With a key configured, the secret column holds the secret sealed with
-- AES-256-GCM (base64 of nonce, ciphertext and tag; see outbox.sealing), and
-- key_id names the key that sealed it. Without one (NULL) the secret is plain
-- text, as every existing row is: existing endpoints keep signing unchanged,
-- and `outbox endpoints rekey` seals them once a key is configured.
ALTER TABLE endpoint_secrets
    ADD COLUMN key_id text CHECK (key_id ~ '^[0-9a-f]{16}$');
