-- 0009: every message names its destination, and ready messages are indexed by it.
--
-- A destination is what the dispatcher shares its capacity across: a webhook
-- endpoint ("endpoint:<id>", the message's target) or the origin of a plain
-- message's URL ("scheme://host:port", lower-cased, the default port written
-- out). The library computes it when it writes a message (outbox._message.
-- url_origin, where the URL is parsed already), so an insert costs no more
-- database CPU than before; here it is computed once for the rows written
-- before, by the same rules (enqueue accepts only http(s) URLs without
-- credentials, so the authority is the host and an optional port).
--
-- The claimable index is keyed by destination first: it lists the destinations
-- that have ready messages, each with its messages in claim order, and the claim
-- walks it from one destination to the next, taking the first few of each (see
-- "claim" in queries/dispatch.sql). It replaces the index in (available_at, id)
-- order rather than joining it, so an insert maintains as many indexes as before;
-- with both, the planner could also walk the old one for one destination's
-- messages, reading every other destination's on the way, and a plan kept by a
-- connection (the dispatcher's are prepared) would go on doing so.
ALTER TABLE messages ADD COLUMN destination text;

UPDATE messages AS m
SET destination = o.destination
FROM (
    SELECT u.id,
           CASE WHEN u.url IS NULL OR starts_with(u.target, 'endpoint:') THEN u.target
                ELSE u.scheme || '://' || lower(h.host) || ':'
                     || CASE WHEN substr(u.authority, length(h.host) + 1) ~ '^:[0-9]+$'
                             THEN CAST(CAST(substr(u.authority, length(h.host) + 2) AS integer)
                                       AS text)
                             WHEN u.scheme = 'https' THEN '443'
                             ELSE '80' END
           END AS destination
    FROM (SELECT id, target, url,
                 lower(substring(url FROM '^([A-Za-z][A-Za-z0-9+.-]*):')) AS scheme,
                 substring(url FROM '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)') AS authority
          FROM messages) AS u
    CROSS JOIN LATERAL (
        SELECT COALESCE(substring(u.authority FROM '^(\[[^]]*\])'),
                        substring(u.authority FROM '^([^:]*)')) AS host
    ) AS h
) AS o
WHERE m.id = o.id;

ALTER TABLE messages ALTER COLUMN destination SET NOT NULL;

DROP INDEX messages_claimable_idx;

CREATE INDEX messages_claimable_idx ON messages (destination, available_at, id)
    WHERE state = 'ready';
