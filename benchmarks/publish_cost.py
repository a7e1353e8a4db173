"""Median time of one ``publish`` inside an open transaction, by the number of
subscribed endpoints (default 1, 10 and 100); with ``--filters``, the cost of the
costliest endpoint filters found instead, each on the payload that makes it work
hardest.

    python benchmarks/publish_cost.py [--database-url URL] [-n 2000]
    python benchmarks/publish_cost.py --filters [--database-url URL] [-n 5]

A filter's evaluation is bounded by a budget of steps and of characters of text
(``outbox._filters``): each case below reaches a bound or the payload's
(``max_body_bytes``, 256 KiB by default), and prints the median time of a
publish that judges it (rolled back), the most memory that publish held at once
(tracemalloc, in a run of its own), the median time of the evaluation alone, the
steps it takes and the verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import psycopg

from dispatchers.bench.env import database, fresh_schema
from outbox import Outbox
from outbox._filters import (
    MAX_FILTER_STEPS,
    MAX_FILTER_TEXT,
    _Budget,
    _interpreter,
    _OverBudget,
    compiled,
)
from outbox._message import DEFAULT_MAX_BODY_BYTES
from outbox.endpoints import Endpoints

ROOM = DEFAULT_MAX_BODY_BYTES - 200  # the envelope's type and timestamp around the payload

#: name, filter, and the payload (within ROOM bytes of JSON) that makes it work hardest
FILTER_CASES: list[tuple[str, str, Callable[[int], object]]] = [
    (
        "typical",
        "amount > `100` && currency == 'EUR'",
        lambda _: {"amount": 150, "currency": "EUR"},
    ),
    # each layer JSON-encodes the one inside, escaping every quote: twice the text
    (
        "to_string x12",
        "to_string(to_array(" * 12 + "a" + "))" * 12,
        lambda n: {"a": '"' * (n // 2 - 8)},
    ),
    # the separator repeated between every element
    ("join separator", "join(s, p)", lambda n: {"s": "x" * (n // 2), "p": [""] * (n // 6)}),
    # a step per node per element, as many as the budget allows
    ("filter projection", "@[?@ > `1` && @ < `8`]", lambda n: [i % 10 for i in range(n // 2)]),
    ("projections", "@" + "[*]" * 80, lambda n: [i % 10 for i in range(n // 2)]),
    ("flattens x4", "[@, @, @, @]" + "[]" * 120, lambda n: [i % 10 for i in range(n // 2)]),
    ("sort_by", "sort_by(@, &@)", lambda n: [i % 10 for i in range(n // 2)]),
    # to_string measures what it would write, a step per element, before writing it
    ("to_string walks", "[to_string(@), to_string(@), to_string(@)]", lambda n: [{}] * (n // 3)),
    # comparisons of whole structures: not steps, bounded by the payload and the length
    ("deep equality", " && ".join(["a == b"] * 25), lambda n: {k: [[0]] * (n // 12) for k in "ab"}),
]


def measure(url: str, endpoints: int, n: int) -> tuple[float, float]:
    with fresh_schema(url) as schema, psycopg.connect(url) as conn:
        registry = Endpoints(schema=schema)
        for i in range(endpoints):
            registry.add(conn, url=f"https://hooks.example.com/{i}", event_types=["order.*"])
        conn.commit()
        box = Outbox(schema=schema)
        samples: list[float] = []
        for i in range(n):
            start = time.perf_counter_ns()
            box.publish(conn, "order.created", {"order_id": i}, idempotency_key=f"o-{i}")
            samples.append((time.perf_counter_ns() - start) / 1000)
            if i % 100 == 99:
                conn.commit()
        conn.commit()
        samples.sort()
        return statistics.median(samples), samples[int(len(samples) * 0.99)]


class _Verdicts(logging.Handler):
    """Keeps why the last filter failed, from the ``outbox.filters`` log."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.failure = message[message.index("(") + 1 : message.index(")")]


def evaluation(text: str, payload: object, n: int) -> tuple[float, int]:
    """The median time of the filter's evaluation alone on the parsed payload,
    and how many steps it takes, up to the budget."""
    parsed = json.loads(json.dumps(payload))
    samples: list[float] = []
    for _ in range(n):
        budget = _Budget()
        start = time.perf_counter()
        with contextlib.suppress(_OverBudget):
            _interpreter()(budget).visit(compiled(text).parsed, parsed)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), MAX_FILTER_STEPS - max(budget.steps, 0)


def measure_filter(url: str, text: str, payload: object, n: int) -> dict[str, Any]:
    log = logging.getLogger("outbox.filters")
    verdicts = _Verdicts()
    log.addHandler(verdicts)
    log.propagate = False
    try:
        with fresh_schema(url) as schema, psycopg.connect(url) as conn:
            Endpoints(schema=schema).add(
                conn, url="https://hooks.example.com/", event_types=["order.*"], filter=text
            )
            conn.commit()
            box = Outbox(schema=schema)
            samples: list[float] = []
            for _ in range(n):
                verdicts.failure = None
                start = time.perf_counter()
                ids = box.publish(conn, "order.created", payload)
                samples.append(time.perf_counter() - start)
                conn.rollback()
            tracemalloc.start()
            try:
                box.publish(conn, "order.created", payload)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
                conn.rollback()
    finally:
        log.removeHandler(verdicts)
        log.propagate = True
    alone, steps = evaluation(text, payload, n)
    return {
        "verdict": verdicts.failure or ("match" if ids else "no match"),
        "publish_ms": statistics.median(samples) * 1000,
        "filter_ms": alone * 1000,
        "peak_mb": peak / 2**20,
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("-n", type=int, help="publishes per size (default 2000; 5 per filter)")
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument(
        "--filters", action="store_true", help="the costliest filters found, one endpoint each"
    )
    parser.add_argument("--room", type=int, default=ROOM, help="bytes of JSON per payload")
    args = parser.parse_args()
    with database(args.database_url) as db:
        if args.filters:
            print(f"budget: {MAX_FILTER_STEPS:,} steps, {MAX_FILTER_TEXT:,} characters of text")
            print(
                f"{'filter':<18} {'chars':>5} {'payload':>8} {'publish ms':>10} {'peak MB':>7}"
                f" {'filter ms':>9} {'steps':>7}  verdict"
            )
            for name, text, make in FILTER_CASES:
                payload = make(args.room)
                size = len(json.dumps(payload, separators=(",", ":")))
                got = measure_filter(db.url, text, payload, args.n or 5)
                print(
                    f"{name:<18} {len(text):>5} {size:>8} {got['publish_ms']:>10.1f}"
                    f" {got['peak_mb']:>7.1f} {got['filter_ms']:>9.1f} {got['steps']:>7}"
                    f"  {got['verdict']}"
                )
            return
        print(f"{'endpoints':>9}  {'median us':>9}  {'p99 us':>8}  {'us/endpoint':>11}")
        for count in args.endpoints:
            median, p99 = measure(db.url, count, args.n or 2000)
            print(f"{count:>9}  {median:>9.0f}  {p99:>8.0f}  {median / count:>11.1f}")


if __name__ == "__main__":
    main()
