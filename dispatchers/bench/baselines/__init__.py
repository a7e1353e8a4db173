"""The designs ``outbox bench --baseline`` measures the dispatcher against, on the
same database and receiver: :mod:`~dispatchers.bench.baselines.naive` (one row at a
time, the design most ports start from) and :mod:`~dispatchers.bench.baselines.pgqueuer`
(pgqueuer, a PostgreSQL job queue, tuned as its documentation says). Neither ever
delivers anything outside a benchmark."""
