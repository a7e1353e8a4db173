-- 0020: only a role that may change an endpoint may enable it.
--
-- The dispatcher records endpoint health, and disables an endpoint that answers
-- 410 Gone or keeps failing: it holds UPDATE on the column "enabled". A column
-- privilege cannot tell false from true, so that grant alone would let the
-- dispatcher's role turn back on an endpoint that an operator disabled (its URL
-- wrong, its receiver compromised). This trigger refuses to turn "enabled" from
-- false to true to a role without UPDATE on the endpoint's "url": the owner and
-- the operator have it (outbox roles), the dispatcher, granted the health
-- columns alone, has not. The refusal is SQLSTATE 42501 (insufficient_privilege),
-- as a missing grant's is.
--
-- What a completion pays: the trigger is considered only by an update that
-- names "enabled" (the general "complete", for a batch with a failure; never
-- "complete_delivered"), and runs only for a row that turns from disabled to
-- enabled, which no dispatcher statement writes.
CREATE FUNCTION endpoint_enable_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT has_column_privilege(TG_RELID, 'url', 'UPDATE') THEN
        RAISE EXCEPTION 'permission denied to enable endpoint %', NEW.id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only a role that may change an endpoint''s url may enable it.';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER endpoints_enable_check
    BEFORE UPDATE OF enabled ON endpoints
    FOR EACH ROW
    WHEN (NEW.enabled AND NOT OLD.enabled)
    EXECUTE FUNCTION endpoint_enable_check();
