"""The scenarios of ``outbox bench``, by name: each bounded in time and count, each
in a fresh schema that is dropped afterwards, all traffic to 127.0.0.1.

``drain-http``, ``drain-noop``, ``latency``, ``enqueue``, ``commit-latency``,
``history``, ``memory`` and ``soak`` (run only when named). With baselines, drains
run in rounds, ours then each baseline's, on the same database and receiver. Each
scenario returns one of the results in :mod:`dispatchers.bench.results`.

Design: docs/explanation/design/benchmarks.md
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
