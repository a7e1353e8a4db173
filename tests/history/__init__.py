"""A seeded history checker that drives the real system and checks its invariants.

One integer seed makes a workload (:mod:`tests.history.workload`): producers that
commit and roll back, share idempotency keys and ordering keys, enqueue and
publish; destinations with caps, rate limits and a breaker that opens; receivers
that answer, fail, time out, hang, answer late and reset; dispatcher processes
killed, frozen past their lease, stopped and restarted; the database restarted
once; and, arranged early so that no run goes without them, a dispatcher stopped
between an answer and its outcome's write (fenced out once it goes on), an
ordering key two producers wait for at once, and an operator's replay and
retry of dead messages (``outbox.admin``). :mod:`tests.history.run` plays it
against real ``outbox dispatch`` processes, a real PostgreSQL and real HTTP
receivers on 127.0.0.1 (:mod:`tests.history.receiver`), and records the history:

- every producer transaction, committed or rolled back, with its xid, the time
  its commit was sent and returned, and the ids it was given;
- every request every receiver saw: arrival and end times, the idempotency key,
  the answer, and what the deduping inbox did with it;
- every change of a message row, a destination's health row and a destination's
  policy, as the database saw it (:mod:`tests.history.audit`: triggers that only
  record, installed in the run's own database), with the writer's session;
- the final rows: messages, delivered history, attempts, the inbox's effects;
- the operator's commands with their transactions, the advisory locks producers
  were seen waiting for (``pg_locks``), and the leases each dispatcher logged as
  lost, with why.

The checks (:mod:`tests.history.checks`) are plain functions of that history,
each named after the invariant of the protocol model (:mod:`tests.model`) it
matches, each returning the violations it found with the evidence to debug them.
``python -m tests.history`` runs many seeds and prints a table of invariants by
faults, with what each seed exercised (:func:`tests.history.report.exercised`);
``tests/history/test_history.py`` runs one short seed in CI and asserts that it
exercised each of :data:`tests.history.report.ASSERTED`.
"""
