-- Publish a row change from the database itself: an AFTER INSERT trigger that
-- publishes "order.created" for each new order, in the inserting transaction.
--
--   psql "$DATABASE_URL" -f examples/trigger_publish.sql
--
-- Every program that inserts an order (in any language, or psql) then publishes
-- its event, once: the key is the order's, so a replayed insert of the same
-- order id publishes nothing again. Run `outbox migrate` first. A role that
-- inserts orders needs EXECUTE on outbox.publish (`outbox roles --producer`),
-- or make the trigger function SECURITY DEFINER, owned by a role that has it.
CREATE SCHEMA IF NOT EXISTS shop;

CREATE TABLE IF NOT EXISTS shop.orders (
    id           bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer     text    NOT NULL,
    total_cents  integer NOT NULL
);

CREATE OR REPLACE FUNCTION shop.order_created() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM outbox.publish(
        event_type      => 'order.created',
        payload         => jsonb_build_object('order_id', NEW.id, 'customer', NEW.customer,
                                              'total_cents', NEW.total_cents),
        idempotency_key => 'shop-order-' || NEW.id || '-created',
        ordering_key    => 'customer-' || NEW.customer);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER order_created
    AFTER INSERT ON shop.orders
    FOR EACH ROW EXECUTE FUNCTION shop.order_created();
