"""The scenarios of ``outbox bench``, by name: each bounded in time and count, each
in a fresh schema that is dropped afterwards, all traffic to 127.0.0.1.

- ``drain-http`` and ``drain-noop`` (:mod:`dispatchers.bench.drain`): a backlog
  delivered to the fast receiver, or to a client that answers without a network.
- ``latency`` (:mod:`dispatchers.bench.latency`): a steady offered load with
  dispatcher processes running, commit to receiver.
- ``enqueue`` (:mod:`dispatchers.bench.enqueue`): what an outbox row costs the
  application's transactions, against the floor.
- ``commit-latency`` (:mod:`dispatchers.bench.commit_latency`): commit latency at
  offered rates, with and without a dispatcher consuming.
- ``history`` (:mod:`dispatchers.bench.history`): drain-noop with a large delivered
  history against an empty one.
- ``memory`` (:mod:`dispatchers.bench.memory`): the dispatcher's peak RSS against a
  slow receiver that answers some requests with a huge body.
- ``soak`` (:mod:`dispatchers.bench.soak`, run only when named): minutes of steady
  load through receiver failures and dispatcher restarts, reported per interval.

With baselines (:mod:`dispatchers.bench.baselines`), each drain scenario runs in
rounds, ours then each baseline's, on the same database and receiver; with
``pgqueuer``, the latency scenario runs pgqueuer after ours at the same offered
load. Each scenario returns one of the results in :mod:`dispatchers.bench.results`.
"""

from __future__ import annotations

from collections.abc import Callable

from dispatchers.bench.commit_latency import commit_latency
from dispatchers.bench.context import Bench
from dispatchers.bench.drain import drain_http, drain_noop
from dispatchers.bench.enqueue import enqueue
from dispatchers.bench.history import history
from dispatchers.bench.latency import latency
from dispatchers.bench.memory import memory
from dispatchers.bench.results import Result
from dispatchers.bench.soak import soak

SCENARIOS: dict[str, Callable[[Bench], Result]] = {
    "drain-http": drain_http,
    "drain-noop": drain_noop,
    "latency": latency,
    "enqueue": enqueue,
    "commit-latency": commit_latency,
    "history": history,
    "memory": memory,
    "soak": soak,
}
