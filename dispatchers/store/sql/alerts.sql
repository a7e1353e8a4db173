-- The alerts a dispatcher raises (dispatchers.runtime.alerts, through
-- dispatchers.store.postgres): each calls a function of migration 0028, which
-- publishes the alert, as the schema's owner, to the endpoints subscribed to it.
-- The other alerts are raised by triggers, in the statements that make them.
--
-- Loaded by dispatchers.store.statements through outbox._queries: "{schema}"
-- becomes the quoted schema identifier; parameters use psycopg's %(name)s style.

-- name: alert_lag
-- The oldest message due has waited %(oldest_s)s seconds (of %(destination)s):
-- 'exceeded' or 'recovered' when this changed the lag's state (and alerted),
-- else NULL.
SELECT {schema}.alert_lag(oldest_s => CAST(%(oldest_s)s AS double precision),
                          threshold_s => CAST(%(threshold_s)s AS double precision),
                          destination => CAST(%(destination)s AS text)) AS changed

-- name: alert_unknown_key
-- A secret of endpoint %(endpoint_id)s is sealed under key %(key_id)s, which
-- this dispatcher lacks: the ids of the alert's messages (none when that key's
-- alert of this hour was raised before, or nobody takes it).
SELECT {schema}.alert_unknown_key(key_id => CAST(%(key_id)s AS text),
                                  endpoint_id => CAST(%(endpoint_id)s AS bigint),
                                  dispatcher => CAST(%(dispatcher)s AS text)) AS message_ids
