-- 0016: an endpoint may filter the events it gets on their payload.
--
-- A JMESPath expression (outbox/_filters.py), checked by the library before it
-- is written; publish sends an event to the endpoint only when the expression's
-- result on the payload is truthy. NULL: every event of its subscribed types.
ALTER TABLE endpoints ADD COLUMN filter text;
