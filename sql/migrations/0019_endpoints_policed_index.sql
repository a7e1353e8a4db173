-- 0019: the endpoints that take a policy (a concurrency cap or a rate limit), by index.
--
-- The cheap claim ("claim_uncapped") asks at every claim whether any destination
-- has a policy, and so whether some messages need the slots of the general
-- claim. For endpoints it read the whole table, one row per subscriber, to find
-- that none has: with thousands of endpoints, most of a claim's cost. This index
-- holds only the endpoints with a policy, so the question is one probe of an
-- index that is usually empty, whatever the number of endpoints.
CREATE INDEX endpoints_policed_idx ON endpoints (id)
    WHERE max_concurrency IS NOT NULL OR rate_limit_per_s IS NOT NULL;
