-- The tables of `outbox demo` (dispatchers.demo): the business application's
-- orders, next to the outbox, and the receiver's effects, next to its inbox;
-- "{schema}" is the schema of each.

-- name: demo_drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE

-- name: demo_orders_create
CREATE TABLE {schema}.orders (id bigint PRIMARY KEY, total integer NOT NULL)

-- name: demo_order_insert
INSERT INTO {schema}.orders (id, total) VALUES (%(id)s, %(total)s)

-- name: demo_effects_create
CREATE TABLE {schema}.effects (
    webhook_id text   PRIMARY KEY,
    endpoint   text   NOT NULL,
    order_id   bigint NOT NULL
)

-- name: demo_effect_insert
INSERT INTO {schema}.effects (webhook_id, endpoint, order_id)
VALUES (%(webhook_id)s, %(endpoint)s, %(order_id)s)

-- name: demo_effects_count
SELECT count(*) AS applied, count(DISTINCT webhook_id) AS distinct_keys
FROM {schema}.effects

-- name: demo_dead_count
SELECT count(*) FROM {schema}.messages WHERE state = 'dead'
