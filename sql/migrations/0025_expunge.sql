-- 0025: erasure. `outbox expunge` replaces what messages said (their bodies and
-- headers, and the receivers' answers recorded with their attempts) with a
-- marker, in the hot table and in the history, and keeps everything else: ids,
-- keys, times, states, statuses and digests, so the delivery record stands and
-- a key given again is still recognised. expunged_at says when; expunges
-- records each erasure: what was asked and how many rows it changed (never the
-- content). An event expunged keeps its record (and its digest), marked, so a
-- replay of it is refused with a reason rather than sent empty.
ALTER TABLE messages ADD COLUMN expunged_at timestamptz;
ALTER TABLE delivered ADD COLUMN expunged_at timestamptz;
ALTER TABLE events ADD COLUMN expunged_at timestamptz;

CREATE TABLE expunges (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    -- what selected the messages: an event, an endpoint's before a time, a key
    scope       text NOT NULL CHECK (scope IN ('event', 'endpoint', 'key')),
    selector    jsonb NOT NULL CHECK (jsonb_typeof(selector) = 'object'),
    messages    integer NOT NULL CHECK (messages >= 0),
    history     integer NOT NULL CHECK (history >= 0),
    cancelled   integer NOT NULL CHECK (cancelled >= 0),
    running     integer NOT NULL CHECK (running >= 0)
);
