-- 0006: signing secrets in a table of their own.
--
-- Whoever can read a signing secret can forge deliveries to its endpoint. In the
-- endpoints table the secrets were readable by every role that reads endpoints:
-- a producer that publishes (it needs the subscriptions), a dashboard that shows
-- their health. Privileges are granted per table, so a table of their own lets
-- `outbox roles` give the secrets to the dispatcher (which signs) and the
-- operator (who rotates them), and to no one else.
--
-- One row per secret. The newest (highest id) signs first; a rotation sets
-- expires_at on the previous ones, which sign until then. Existing secrets are
-- copied over in their order (the array held the newest first), then the column
-- is dropped.
CREATE TABLE endpoint_secrets (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  bigint      NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    secret       text        NOT NULL,
    expires_at   timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- An endpoint's secrets, newest first: how the claim and the endpoints API read them.
CREATE INDEX endpoint_secrets_endpoint_idx ON endpoint_secrets (endpoint_id, id);

INSERT INTO endpoint_secrets (endpoint_id, secret, expires_at)
SELECT e.id, s.value ->> 'secret', CAST(s.value ->> 'expires_at' AS timestamptz)
FROM endpoints AS e
CROSS JOIN LATERAL jsonb_array_elements(e.secrets) WITH ORDINALITY AS s(value, n)
-- ids are assigned in this order: oldest first, so that the newest has the highest
ORDER BY e.id, s.n DESC;

ALTER TABLE endpoints DROP COLUMN secrets;
