"""The rows of the table ``outbox bench`` prints, from each scenario's result: one
row per figure, beside the target it has (the targets live here, with the
measures they judge).

A missed target is reported, never hidden; the exit status depends only on
correctness (see :mod:`dispatchers.bench.runner`).

The module stays whole: each target sits beside the row that judges it, and
the rows make one table.
"""

from __future__ import annotations

from dispatchers.bench.memory import MEMORY_CONCURRENCY
from dispatchers.bench.results import (
    BaselineDrains,
    CommitLatencyResult,
    CommitLatencyRun,
    DrainResult,
    DrainRun,
    EnqueueResult,
    HistoryResult,
    LatencyComparison,
    LatencyResult,
    LatencyRun,
    MemoryResult,
    PgqueuerFacts,
    Result,
    SoakResult,
    Throughput,
    Trend,
)
from dispatchers.bench.table import Row, Target, at_least, at_most, below, number, numbers, row


def _rss(peak: float | None, growth: float | None) -> str:
    """Peak RSS in MB, and in brackets how much of it the drain added."""
    if peak is None:
        return "n/a"
    return f"{peak:,.0f}" + ("" if growth is None else f" (+{growth:,.0f})")


def _rss_measure(runs: list[DrainRun]) -> str:
    return "peak RSS MB (+ during drain)" + (", worst run" if len(runs) > 1 else "")


def _drain_rows(name: str, r: DrainResult, rate: Target) -> list[Row]:
    m = r.summary
    rows = [
        row(
            name,
            "msgs/s" + (" (median)" if len(r.runs) > 1 else ""),
            m.msgs_per_s,
            ",.0f",
            rate,
        ),
        row(name, "db round trips per msg", m.round_trips_per_msg, ".4f", at_most(0.05, "<= 0.05")),
        row(name, "CPU us/msg, PostgreSQL", m.cpu_postgres_us_per_msg, ",.0f"),
        row(
            name,
            "CPU us/msg, dispatcher",
            m.cpu_dispatcher_us_per_msg,
            ",.0f",
            # per HTTP delivery: the client and the event loop's share
            at_most(130, "<= 130") if name == "drain-http" else None,
        ),
    ]
    if m.cpu_receiver_us_per_msg is not None:
        rows.append(row(name, "CPU us/msg, receiver", m.cpu_receiver_us_per_msg, ",.0f"))
    if r.destinations > 1:
        rows.append(Row(name, "destinations, messages spread in turn", str(r.destinations)))
    rows.append(Row(name, _rss_measure(r.runs), _rss(m.peak_rss_mb, m.rss_growth_mb)))
    duplicates = "n/a" if m.duplicates is None else str(m.duplicates)
    rows.append(
        Row(name, "delivered / duplicates", f"{m.delivered} of {m.messages} / {duplicates}")
    )
    if len(r.runs) > 1:
        rows.append(Row(name, "msgs/s per run", numbers([x.msgs_per_s for x in r.runs], ",.0f")))
    for base in r.baselines:
        rows += _baseline_drain_rows(name, base)
    return rows


def _baseline_drain_rows(name: str, base: BaselineDrains) -> list[Row]:
    """The baseline's drains beside ours: its figures, then ours / its msgs/s."""
    facts = base.facts
    if isinstance(facts, PgqueuerFacts):
        label = f"pgqueuer {facts.version} ({facts.managers} managers x batch {facts.batch_size})"
        # the target is drain-noop's: without a network, the queue machinery alone
        target = at_least(2, ">= 2x") if name == "drain-noop" else None
    else:
        label = f"naive baseline ({facts.workers} workers)"
        target = at_least(4, ">= 4x")
    m = base.summary
    rows = [
        Row(name, f"{label}: msgs/s per run", numbers([x.msgs_per_s for x in base.runs], ",.0f")),
        row(name, f"{label}: db round trips per msg", m.round_trips_per_msg, ".4f"),
        row(name, f"{label}: CPU us/msg, PostgreSQL", m.cpu_postgres_us_per_msg, ",.0f"),
        row(name, f"{label}: CPU us/msg, dispatcher", m.cpu_dispatcher_us_per_msg, ",.0f"),
    ]
    if m.cpu_receiver_us_per_msg is not None:
        rows.append(row(name, f"{label}: CPU us/msg, receiver", m.cpu_receiver_us_per_msg, ",.0f"))
    rows.append(
        Row(name, f"{label}: {_rss_measure(base.runs)}", _rss(m.peak_rss_mb, m.rss_growth_mb))
    )
    duplicates = "n/a" if m.duplicates is None else str(m.duplicates)
    rows += [
        Row(
            name,
            f"{label}: delivered / duplicates",
            f"{m.delivered} of {m.messages} / {duplicates}",
        ),
        Row(name, f"ours / {facts.name}, per pair", numbers(base.ratios, ".2f")),
        row(name, f"ours / {facts.name}, median", base.median_ratio, ".2f", target),
    ]
    return rows


LATENCY_TARGET_RATE = 500.0
"""The offered load at which the latency and cost targets apply."""


def _latency_rows(r: LatencyRun) -> list[Row]:
    """The rows of one latency run; targets apply at :data:`LATENCY_TARGET_RATE`."""
    n = f"latency {r.offered_rate:g}/s x{r.dispatchers}"
    targeted = r.offered_rate == LATENCY_TARGET_RATE

    def target(t: Target) -> Target | None:
        return t if targeted else None

    return [
        Row(
            n,
            "offered / achieved msgs/s",
            f"{r.offered_rate:,.0f} / {number(r.achieved_rate)} for {r.duration_s:g} s",
        ),
        row(n, "commit -> receiver p50 ms", r.p50_ms, ".1f", target(at_most(5, "<= 5"))),
        row(n, "commit -> receiver p95 ms", r.p95_ms, ".1f"),
        row(n, "commit -> receiver p99 ms", r.p99_ms, ".1f", target(at_most(25, "<= 25"))),
        row(n, "commit -> receiver max ms", r.max_ms, ".1f"),
        row(n, "producers' worst lateness ms (machine stalls)", r.producer_late_max_ms, ".0f"),
        row(
            n,
            "CPU us/msg, dispatchers",
            r.cpu_dispatcher_us_per_msg,
            ",.0f",
            target(at_most(300, "<= 300")),
        ),
        row(
            n,
            "CPU us/msg, PostgreSQL (enqueue + dispatch)",
            r.cpu_postgres_us_per_msg,
            ",.0f",
            target(at_most(250, "<= 250")),
        ),
        row(
            n,
            "  of it the producers' transactions (enqueue, commit)",
            r.cpu_postgres_producers_us_per_msg,
            ",.0f",
        ),
        row(n, "claims per msg", r.claims_per_msg, ".3f"),
        row(
            n,
            "claims that found nothing",
            r.empty_claim_share,
            ".1%",
            target(at_most(0.10, "<= 10%")),
        ),
        row(n, "db round trips per msg (dispatchers)", r.round_trips_per_msg, ".3f"),
        row(n, "notifications received per msg", r.notifications_per_msg, ".3f"),
        Row(n, "received / duplicates", f"{r.received} of {r.messages} / {r.duplicates}"),
    ]


def _latency_baseline_rows(ours: LatencyRun, c: LatencyComparison) -> list[Row]:
    """pgqueuer's latency run beside one of ours, and the ratios ours / theirs
    (below 1: ours is lower; the targets hold at 500 msgs/s)."""
    r = c.theirs
    n = f"latency {ours.offered_rate:g}/s x{ours.dispatchers}"
    targeted = ours.offered_rate == LATENCY_TARGET_RATE
    label = f"pgqueuer {r.version} ({r.managers} manager x batch {r.batch_size})"
    lower = below(1, "< 1 (ours lower)") if targeted else None
    return [
        Row(
            n,
            f"{label}: offered / achieved msgs/s",
            f"{r.offered_rate:,.0f} / {number(r.achieved_rate)} for {r.duration_s:g} s",
        ),
        row(n, f"{label}: commit -> receiver p50 ms", r.p50_ms, ".1f"),
        row(n, f"{label}: commit -> receiver p95 ms", r.p95_ms, ".1f"),
        row(n, f"{label}: commit -> receiver p99 ms", r.p99_ms, ".1f"),
        row(n, f"{label}: commit -> receiver max ms", r.max_ms, ".1f"),
        row(n, f"{label}: CPU us/msg, consumer", r.cpu_dispatcher_us_per_msg, ",.0f"),
        row(
            n,
            f"{label}: CPU us/msg, PostgreSQL (enqueue + dispatch)",
            r.cpu_postgres_us_per_msg,
            ",.0f",
        ),
        row(n, f"{label}: db round trips per msg (consumer)", r.round_trips_per_msg, ".2f"),
        Row(
            n,
            f"{label}: received / duplicates",
            f"{r.received} of {r.messages} / {r.duplicates}",
        ),
        row(n, "ours / pgqueuer, p50", c.p50_ratio, ".2f", lower),
        row(n, "ours / pgqueuer, p99", c.p99_ratio, ".2f"),
        row(
            n,
            "ours / pgqueuer, CPU us/msg dispatcher",
            c.cpu_dispatcher_us_per_msg_ratio,
            ".2f",
            lower,
        ),
        row(
            n,
            "ours / pgqueuer, CPU us/msg PostgreSQL",
            c.cpu_postgres_us_per_msg_ratio,
            ".2f",
            lower,
        ),
    ]


def _enqueue_rows(r: EnqueueResult) -> list[Row]:
    n = "enqueue"
    rows = [
        row(
            n,
            "enqueue median ms, no NOTIFY",
            r.no_notify.median_ms,
            ".3f",
            at_most(0.2, "<= 0.2"),
        ),
        row(n, "enqueue p99 ms, no NOTIFY", r.no_notify.p99_ms, ".3f"),
        row(n, "enqueue median ms, NOTIFY", r.notify.median_ms, ".3f", at_most(0.2, "<= 0.2")),
        row(n, "enqueue p99 ms, NOTIFY", r.notify.p99_ms, ".3f"),
    ]
    for c in r.commit_throughput:
        rows += _throughput_rows(n, c)
    return rows


def _throughput_rows(n: str, c: Throughput) -> list[Row]:
    """Business transactions per second at one count of connections, by mode."""
    w = f"{c.workers} conns"
    rows = [
        row(n, f"{w}: business tx/s, no outbox", c.plain_tx_per_s, ",.0f"),
        row(n, f"{w}: business tx/s + floor row", c.floor_tx_per_s, ",.0f"),
        row(n, f"{w}: business tx/s + outbox row (NOTIFY)", c.outbox_tx_per_s, ",.0f"),
        row(
            n,
            f"{w}: business tx/s + outbox row (no NOTIFY)",
            c.outbox_no_notify_tx_per_s,
            ",.0f",
        ),
        row(n, f"{w}:   floor / no outbox", c.floor_ratio, ".2f"),
        row(n, f"{w}:   outbox (NOTIFY) / no outbox", c.ratio, ".2f"),
        row(
            n,
            f"{w}:   outbox (NOTIFY) / floor",
            c.outbox_to_floor,
            ".2f",
            at_least(0.8, ">= 0.80"),
        ),
        row(n, f"{w}:   outbox (no NOTIFY) / floor", c.outbox_no_notify_to_floor, ".2f"),
        row(
            n,
            f"{w}:   NOTIFY's cost, 1 - NOTIFY / no NOTIFY",
            c.notify_cost,
            ".1%",
            at_most(0.05, "<= 5% at 8") if c.workers == 8 else None,
        ),
    ]
    for mode, label in (
        ("plain", "no outbox"),
        ("floor", "+ floor row"),
        ("outbox", "+ outbox (NOTIFY)"),
        ("outbox-no-notify", "+ outbox (no NOTIFY)"),
    ):
        app = c.client_cpu_us_per_tx[mode]
        pg = c.postgres_cpu_us_per_tx[mode]
        rows.append(
            Row(n, f"{w}: CPU us/tx {label}: app / PostgreSQL", f"{number(app)} / {number(pg)}")
        )
    return rows


def _commit_latency_rows(n: str, run: CommitLatencyRun, producers: int) -> list[Row]:
    """Commit latency at each offered rate, with or without a dispatcher consuming."""
    d = "dispatcher on" if run.dispatcher else "no dispatcher"
    rows = []
    for r in run.rates:
        at = f"{r.offered_tx_per_s:,.0f}/s, {producers} conns, {d}"
        target = at_most(10, "<= 10 at 2,000/s") if r.offered_tx_per_s == 2000 else None
        rows += [
            Row(n, f"{at}: committed", f"{r.committed:,} of {r.expected:,}"),
            row(n, f"{at}: commit p50 ms", r.p50_ms, ".2f"),
            row(n, f"{at}: commit p99 ms", r.p99_ms, ".2f", target),
            row(n, f"{at}: p99 ms from its scheduled start", r.p99_from_schedule_ms, ".2f"),
            Row(
                n,
                f"{at}: CPU us/tx app / PostgreSQL",
                f"{number(r.client_cpu_us_per_tx)} / {number(r.postgres_cpu_us_per_tx)}",
            ),
        ]
    return rows


def _history_rows(r: HistoryResult) -> list[Row]:
    n = "history"
    rounds = f" (median of {r.rounds})" if r.rounds > 1 else ""
    return [
        row(n, f"drain-noop msgs/s, empty history{rounds}", r.empty_msgs_per_s, ",.0f"),
        row(
            n,
            f"drain-noop msgs/s, {r.history_rows:,} in history{rounds}",
            r.full_msgs_per_s,
            ",.0f",
        ),
        Row(n, "  full / empty, per round", numbers(r.ratios, ".2f")),
        row(n, "  full / empty, of the medians", r.ratio, ".2f", at_least(0.9, ">= 0.90")),
        row(n, "seeding the history, s", r.history_seed_s, ".1f"),
        Row(
            n,
            "peak RSS MB, empty / full history",
            f"{number(r.empty_peak_rss_mb)} / {number(r.full_peak_rss_mb)}",
        ),
    ]


def _memory_rows(r: MemoryResult) -> list[Row]:
    n = "memory"
    rows = [
        Row(
            n,
            "drain-http, responses with a big body",
            f"{r.big_response_share:g} of them, {r.big_response_mb:g} MB each"
            f" (all {r.delay_s:g} s late)",
        )
    ]
    for run in r.runs:
        c = run.concurrency or 0
        target = at_most(150, "<= 150") if c == MEMORY_CONCURRENCY[0] else None
        peak = row(n, f"peak RSS MB at concurrency {c:,}", run.peak_rss_mb, ",.0f", target)
        rows += [
            peak,
            row(n, "  of it added during the drain", run.rss_growth_mb, ",.0f"),
            row(n, "  msgs/s", run.msgs_per_s, ",.0f"),
            Row(
                n,
                "  connections: most open at once / opened",
                f"{run.most_open_connections:,} / {run.receiver_connections:,}",
            ),
            row(n, "  MB of big bodies the receiver wrote", run.big_mb_sent, ",.1f"),
            row(n, "  CPU us/msg, dispatcher", run.cpu_dispatcher_us_per_msg, ",.0f"),
            Row(
                n,
                "  delivered / duplicates / big bodies",
                f"{run.delivered} of {run.messages} / {run.duplicates} / {run.big_responses}",
            ),
        ]
    return rows


def _trend_row(n: str, measure: str, t: Trend, spec: str) -> Row:
    """A figure's peak during the warm-up and after it, judged flat or not."""
    value = f"{number(t.warmup_peak, spec)} -> {number(t.later_peak, spec)}"
    return Row(
        n, f"{measure}, peak in the first {t.warmup_intervals} -> after", value, "flat", t.flat
    )


def _soak_rows(r: SoakResult) -> list[Row]:
    """The soak: its load, a row per interval, where every message ended, and
    whether memory and the claimable table stayed flat."""
    n = "soak"
    rows = [
        Row(
            n,
            "offered / achieved msgs/s",
            f"{r.offered_rate:,.0f} / {number(r.achieved_rate)} for {r.duration_s:g} s",
        ),
        Row(
            n,
            "dispatchers, the last restarted every interval",
            f"{r.dispatchers}; {r.restarts} restarts, slowest stop "
            f"{number(r.restart_stop_max_s, '.1f')} s",
        ),
        Row(
            n,
            "receiver: answered 500 / late",
            f"{r.failed_requests:,} / {r.delayed_requests:,} "
            f"({r.fail_share:.0%} / {r.slow_share:.0%}, {r.slow_delay_s:g} s late)",
        ),
        Row(
            n,
            f"every {r.interval_s:g} s: delivered / lag p99 ms / RSS MB per dispatcher / "
            "messages MB (indexes)",
            "",
        ),
    ]
    for i in r.intervals:
        rows.append(
            Row(
                n,
                f"  to {i.end_s:,.0f} s",
                f"{i.delivered:,} / {number(i.lag_p99_ms)} / {numbers(i.rss_mb, ',.0f')} / "
                f"{i.messages_mb:.2f} ({i.messages_indexes_mb:.2f})",
            )
        )
    rows.append(
        Row(
            n,
            "committed / delivered / retrying / dead / lost / duplicates",
            f"{r.committed:,} / {r.delivered:,} / {r.retrying} / {r.dead} / {r.lost} / "
            f"{r.duplicates}",
        )
    )
    for k, t in enumerate(r.rss, 1):
        rows.append(_trend_row(n, f"RSS MB of dispatcher {k}", t, ",.0f"))
    rows.append(_trend_row(n, "messages MB", r.messages_size, ".2f"))
    return rows


def table_rows(results: dict[str, Result]) -> list[Row]:
    """The table's rows for the scenarios that ran (a failed scenario has none)."""
    rows: list[Row] = []
    r = results.get("drain-http")
    if isinstance(r, DrainResult):
        rows += _drain_rows("drain-http", r, at_least(4000, ">= 4,000"))
    r = results.get("drain-noop")
    if isinstance(r, DrainResult):
        rows += _drain_rows("drain-noop", r, at_least(10_000, ">= 10,000"))
    r = results.get("latency")
    if isinstance(r, LatencyResult):
        for run in r.runs:
            rows += _latency_rows(run)
            if run.baseline:
                rows += _latency_baseline_rows(run, run.baseline)
    r = results.get("enqueue")
    if isinstance(r, EnqueueResult):
        rows += _enqueue_rows(r)
    r = results.get("commit-latency")
    if isinstance(r, CommitLatencyResult):
        for paced in r.runs:
            rows += _commit_latency_rows("commit-latency", paced, r.producers)
    r = results.get("history")
    if isinstance(r, HistoryResult):
        rows += _history_rows(r)
    r = results.get("memory")
    if isinstance(r, MemoryResult):
        rows += _memory_rows(r)
    r = results.get("soak")
    if isinstance(r, SoakResult):
        rows += _soak_rows(r)
    return rows
