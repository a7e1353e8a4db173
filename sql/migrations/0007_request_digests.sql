-- 0007: a key given again must ask for the same thing.
--
-- An idempotency key promises one effect for one request. A key reused for a
-- different request used to return the first message's id, so the second
-- request was silently dropped. Each key now keeps a SHA-256 digest of its
-- request (computed by the library, outbox/_digest.py): enqueuing the key again
-- with the same digest is a retry and returns the first id; with another digest
-- it raises IdempotencyKeyReused. Keys written before this migration have a NULL
-- digest and accept any request, as they did. Webhook keys
-- ("<event key>:<endpoint id>") have none either: their event row holds it.
ALTER TABLE message_keys ADD COLUMN digest bytea;

-- publish is once per event key: the first publish records the event and the
-- ids of the messages it wrote, and publishing the key again writes nothing
-- (even for endpoints subscribed since) and returns those ids, or raises
-- IdempotencyKeyReused when the type or payload differs (digest). Retention
-- removes rows older than the retention period, as it removes keys.
CREATE TABLE events (
    event_key    text        PRIMARY KEY,
    event_type   text        NOT NULL,
    digest       bytea       NOT NULL,
    message_ids  bigint[]    NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- retention's walk, oldest first
CREATE INDEX events_created_idx ON events (created_at);
