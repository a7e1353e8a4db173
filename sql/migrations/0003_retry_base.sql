-- 0003: where a message's current attempt budget began.
--
-- Redriving a dead message (or replaying a delivered one) keeps its attempt
-- count, since attempt numbers are fencing tokens and must never repeat, and
-- raises max_attempts on top of it. Retry delays are computed from
-- attempts - retry_base, so a redriven message starts again at the short end of
-- its schedule instead of at the delay its old attempts had reached.
ALTER TABLE messages
    ADD COLUMN retry_base integer NOT NULL DEFAULT 0 CHECK (retry_base >= 0);
