"""The ``history`` scenario: drain-noop with a large delivered history against an
empty one, to show that claim speed does not decay as history grows (delivered
messages leave the claimable table)."""

from __future__ import annotations

import json
import time

from dispatchers.bench.context import Bench
from dispatchers.bench.drain import NOOP_URL, drain_in
from dispatchers.bench.env import bench_queries, connect, fresh_schema, payload
from dispatchers.bench.measure import analyze, median, most
from dispatchers.bench.results import DrainRun, HistoryResult


def seed_history(bench: Bench, schema: str, *, rows: int, target: str) -> float:
    """Write a delivered history of ``rows`` messages to ``schema``, then ANALYZE the
    tables; return the seconds it took."""
    started = time.perf_counter()
    with connect(bench.db.url, autocommit=True) as conn:
        conn.execute(
            bench_queries(schema)["seed_history"],
            {"rows": rows, "target": target, "body": json.dumps(payload(0)).encode()},
        )
    analyze(bench.db.url, schema)
    return time.perf_counter() - started


def history(bench: Bench) -> HistoryResult:
    """drain-noop in a schema with ``history_rows`` delivered messages against one
    without, alternating (empty, full) ``history_rounds`` times."""
    s = bench.settings
    empty: list[DrainRun] = []
    full: list[DrainRun] = []
    with fresh_schema(bench.db.url) as empty_schema, fresh_schema(bench.db.url) as full_schema:
        bench.progress(f"history: seeding {s.history_rows:,} delivered messages")
        seed_s = seed_history(bench, full_schema, rows=s.history_rows, target=NOOP_URL)
        for i in range(s.history_rounds):
            bench.progress(f"history: round {i + 1}/{s.history_rounds}: empty history")
            empty.append(
                drain_in(
                    bench, empty_schema, design="outbox", http=False, messages=s.history_messages
                )
            )
            bench.progress(f"history: round {i + 1}/{s.history_rounds}: full history")
            full.append(
                drain_in(
                    bench, full_schema, design="outbox", http=False, messages=s.history_messages
                )
            )
    empty_rate = median([r.msgs_per_s for r in empty])
    full_rate = median([r.msgs_per_s for r in full])
    failures = [f"{r.history_rows:,} in history: {f}" for r in empty + full for f in r.failures]
    return HistoryResult(
        messages=s.history_messages,
        history_rows=s.history_rows,
        rounds=s.history_rounds,
        empty_msgs_per_s=empty_rate,
        full_msgs_per_s=full_rate,
        ratio=full_rate / empty_rate if full_rate and empty_rate else None,
        ratios=[
            b.msgs_per_s / a.msgs_per_s if a.msgs_per_s and b.msgs_per_s else None
            for a, b in zip(empty, full, strict=True)
        ],
        history_seed_s=seed_s,
        empty_peak_rss_mb=most([r.peak_rss_mb for r in empty]),
        full_peak_rss_mb=most([r.peak_rss_mb for r in full]),
        delivered=sum(r.delivered for r in empty + full),
        empty_runs=empty,
        full_runs=full,
        ok=not failures,
        failures=failures,
    )
