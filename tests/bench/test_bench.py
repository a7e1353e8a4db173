"""``outbox bench`` runs every scenario end to end and reports plausible figures.

Tiny sizes against the test database: these tests pin down behaviour (every message
delivered once, figures present, schemas dropped, receiver gone), never speed.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatchers.bench.baselines import pgqueuer
from dispatchers.cli import main
from dispatchers.runtime import loop as loops

TINY = [
    "--messages",
    "150",
    "--rate",
    "100",
    "--dispatchers",
    "1,2",
    "--duration",
    "1",
    "--enqueue-count",
    "100",
    "--enqueue-batch",
    "10",
    "--commit-workers",
    "2",
    "--commit-seconds",
    "0.3",
    "--commit-rounds",
    "1",
    "--commit-rates",
    "40,80",
    "--commit-producers",
    "2",
    "--commit-rate-seconds",
    "0.5",
    "--history-rows",
    "2000",
    "--history-messages",
    "150",
    "--drain-timeout",
    "30",
    "--memory-messages",
    "200",
    "--memory-delay",
    "0.05",
    "--big-response-share",
    "0.05",
    "--big-response-mb",
    "32",
]


def run_bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["bench", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def bench_schemas(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'outbox_bench%'"
        ).fetchall()
    return [r[0] for r in rows]


def child_commands() -> list[str]:
    """Command lines of this process's live children (zombies have none)."""
    found = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split()[1] == me and cmdline:
            found.append(cmdline)
    return found


def check_drain_run(run: dict[str, Any], messages: int) -> None:
    assert run["ok"], run["failures"]
    assert run["delivered"] == messages
    assert run["rows_in_messages"] == 0
    assert run["rows_in_delivered"] == messages
    assert run["msgs_per_s"] > 0
    assert run["round_trips_per_msg"] > 0
    assert run["cpu_dispatcher_us_per_msg"] > 0
    # the drain ran in a process of its own: its peak RSS holds at least what it
    # had once everything was imported, and more than a bare interpreter's
    assert 10 < run["peak_rss_mb"] < 10_000
    assert 0 <= run["rss_growth_mb"] <= run["peak_rss_mb"]


def check_throughput(throughput: dict[str, Any], *, workers: int) -> None:
    assert throughput["workers"] == workers
    for mode in ("plain", "floor", "outbox", "outbox_no_notify"):
        assert throughput[f"{mode}_tx_per_s"] > 0
    assert throughput["ratio"] == pytest.approx(
        throughput["outbox_tx_per_s"] / throughput["plain_tx_per_s"]
    )
    assert throughput["outbox_to_floor"] == pytest.approx(
        throughput["outbox_tx_per_s"] / throughput["floor_tx_per_s"]
    )
    assert throughput["notify_cost"] == pytest.approx(
        1 - throughput["outbox_tx_per_s"] / throughput["outbox_no_notify_tx_per_s"]
    )
    for mode in ("plain", "floor", "outbox", "outbox-no-notify"):
        assert throughput["client_cpu_us_per_tx"][mode] > 0


@pytest.mark.slow
def test_every_scenario_reports_plausible_figures(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_bench(capsys, "--database-url", database_url, *TINY)

    assert code == 0, report
    assert report["ok"]
    results = report["scenarios"]
    assert list(results) == [
        "drain-http",
        "drain-noop",
        "latency",
        "enqueue",
        "commit-latency",
        "history",
        "memory",
    ]
    assert report["machine"]["event_loop"] == loops.resolve("auto")  # uvloop where installed
    with psycopg.connect(database_url) as conn:
        version = conn.info.parameter_status("server_version")
        (jit,) = conn.execute(
            "SELECT CASE WHEN pg_jit_available() THEN current_setting('jit') ELSE 'unavailable' END"
        ).fetchone() or (None,)
    assert (report["machine"]["postgres"], report["machine"]["postgres_jit"]) == (version, jit)

    http = results["drain-http"]
    assert http["delivered"] == 150
    assert http["duplicates"] == 0
    assert http["msgs_per_s"] > 0
    # measured (from /proc, in 10 ms ticks: 150 requests may cost the receiver less)
    assert http["cpu_receiver_us_per_msg"] is not None
    ticks = http["cpu_receiver_us_per_msg"] * 150 / 1e6 * os.sysconf("SC_CLK_TCK")
    assert ticks >= 0 and ticks == pytest.approx(round(ticks), abs=1e-6)  # whole ticks
    (run,) = http["runs"]
    check_drain_run(run, 150)
    assert run["receiver_requests"] == 150
    assert http["baselines"] == []

    noop = results["drain-noop"]
    (run,) = noop["runs"]
    check_drain_run(run, 150)
    assert run["cpu_receiver_us_per_msg"] is None  # nothing was sent anywhere

    latency = results["latency"]
    assert latency["ok"], latency["failures"]
    assert [(r["offered_rate"], r["dispatchers"]) for r in latency["runs"]] == [(100, 1), (100, 2)]
    for run in latency["runs"]:
        assert run["messages"] == run["received"] == run["delivered"] == 100
        assert run["duplicates"] == 0
        # the receiver's clock and the producer's are the same host's: a delay is
        # small and ordered, whatever the machine's speed
        assert -50 < run["p50_ms"] <= run["p95_ms"] <= run["p99_ms"] <= run["max_ms"]
        assert run["max_ms"] < 60_000
        assert run["cpu_dispatcher_us_per_msg"] > 0
        # the producers' server processes are a part of the server's CPU
        assert 0 < run["cpu_postgres_producers_us_per_msg"] <= run["cpu_postgres_us_per_msg"]
        assert run["round_trips_per_msg"] > 0
        # a claim that found something took at least one message
        assert 0 <= run["empty_claim_share"] < 1
        assert 0 < run["claims_per_msg"] * (1 - run["empty_claim_share"]) <= 1 + 1e-9

    enqueue = results["enqueue"]
    assert enqueue["ok"], enqueue["failures"]
    for mode in ("notify", "no_notify"):
        timing = enqueue[mode]
        assert timing["stored"] == 100
        assert 0 < timing["median_ms"] <= timing["p99_ms"]
    (throughput,) = enqueue["commit_throughput"]
    check_throughput(throughput, workers=2)
    assert results["commit-latency"]["ok"], results["commit-latency"]["failures"]

    history = results["history"]
    assert history["ok"], history["failures"]
    for run in history["empty_runs"] + history["full_runs"]:
        check_drain_run(run, 150)
    # rounds alternate between the two schemas; each keeps what it delivered
    assert [r["history_rows"] for r in history["empty_runs"]] == [0, 150]
    assert [r["history_rows"] for r in history["full_runs"]] == [2000, 2150]
    assert history["ratio"] == pytest.approx(
        statistics.median(r["msgs_per_s"] for r in history["full_runs"])
        / statistics.median(r["msgs_per_s"] for r in history["empty_runs"])
    )

    memory = results["memory"]
    assert memory["ok"], memory["failures"]
    assert [r["concurrency"] for r in memory["runs"]] == [256, 1024]
    for run in memory["runs"]:
        check_drain_run(run, 200)
        assert run["duplicates"] == 0
        assert run["big_responses"] == 10  # every 20th of 200
        # the dispatcher closed each big body early: the receiver wrote a few MB of
        # each (what the loopback's buffers take), far from 10 x 32 MB
        assert run["big_mb_sent"] < 10 * 32 / 2

    measures = {(row["scenario"], row["measure"]) for row in report["table"]}
    assert ("drain-http", "db round trips per msg") in measures
    assert ("latency 100/s x1", "commit -> receiver p99 ms") in measures
    assert ("latency 100/s x2", "claims that found nothing") in measures
    assert ("history", "  full / empty, of the medians") in measures
    assert ("drain-http", "peak RSS MB (+ during drain)") in measures
    rss = next(r for r in report["table"] if r["measure"] == "peak RSS MB at concurrency 256")
    assert rss["target"] == "<= 150"
    assert ("memory", "peak RSS MB at concurrency 1,024") in measures

    assert bench_schemas(database_url) == []  # every scenario dropped its schema
    assert not [c for c in child_commands() if "receiver.py" in c]


@pytest.mark.slow
def test_naive_baseline_runs_interleaved_with_ours(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_bench(
        capsys,
        "--database-url",
        database_url,
        "--scenario",
        "drain-http",
        "--scenario",
        "drain-noop",
        "--baseline",
        "naive",
        "--pairs",
        "2",
        "--naive-workers",
        "8",
        *TINY,
    )

    assert code == 0, report
    assert list(report["scenarios"]) == ["drain-http", "drain-noop"]
    for name in ("drain-http", "drain-noop"):
        result = report["scenarios"][name]
        assert result["ok"], result["failures"]
        (base,) = result["baselines"]
        assert base["name"] == "naive"
        assert [r["design"] for r in result["runs"]] == ["outbox", "outbox"]
        assert [r["design"] for r in base["runs"]] == ["naive", "naive"]
        for ours, naive in zip(result["runs"], base["runs"], strict=True):
            check_drain_run(ours, 150)
            check_drain_run(naive, 150)
        # one claim and one completion per message, plus one empty claim per worker
        assert base["round_trips_per_msg"] == pytest.approx(2 + 8 / 150)
        assert len(base["ratios"]) == 2
        assert all(ratio > 0 for ratio in base["ratios"])
        assert base["median_ratio"] == pytest.approx(statistics.median(base["ratios"]))
    assert report["scenarios"]["drain-http"]["baselines"][0]["duplicates"] == 0
    assert bench_schemas(database_url) == []


def pgqueuer_schemas(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE '%pgq%'"
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.skipif(
    pgqueuer.available() is not None,
    reason=f"the pgqueuer baseline needs the bench extra: {pgqueuer.available()}",
)
@pytest.mark.slow
def test_pgqueuer_and_naive_baselines_handle_every_job_once_beside_ours(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_bench(
        capsys,
        "--database-url",
        database_url,
        "--scenario",
        "drain-http",
        "--scenario",
        "drain-noop",
        "--scenario",
        "latency",
        "--baseline",
        "pgqueuer",
        "--baseline",
        "naive",
        "--pairs",
        "1",
        *TINY,
        "--messages",
        "200",
    )

    assert code == 0, report
    noop = report["scenarios"]["drain-noop"]
    assert noop["ok"], noop["failures"]
    (ours,) = noop["runs"]
    check_drain_run(ours, 200)
    # both baselines, in the order given, each beside the same run of ours
    base, naive = noop["baselines"]
    assert naive["name"] == "naive"
    (naive_run,) = naive["runs"]
    check_drain_run(naive_run, 200)
    assert naive["ratios"] == [pytest.approx(ours["msgs_per_s"] / naive_run["msgs_per_s"])]
    assert base["name"] == "pgqueuer"
    assert (base["managers"], base["batch_size"]) == (5, 10)
    (theirs,) = base["runs"]
    assert theirs["design"] == "pgqueuer"
    assert theirs["ok"], theirs["failures"]
    # each job handled once, deleted from their queue and logged as a success
    assert theirs["delivered"] == theirs["handled"] == 200
    assert theirs["duplicates"] == 0
    assert theirs["rows_in_queue"] == 0
    assert theirs["rows_logged_successful"] == 200
    assert theirs["msgs_per_s"] > 0
    assert theirs["cpu_dispatcher_us_per_msg"] > 0
    assert theirs["round_trips_per_msg"] > 0
    assert base["ratios"] == [pytest.approx(ours["msgs_per_s"] / theirs["msgs_per_s"])]
    assert base["median_ratio"] == base["ratios"][0]

    http = report["scenarios"]["drain-http"]
    assert http["ok"], http["failures"]
    (theirs,) = http["baselines"][0]["runs"]
    assert theirs["delivered"] == theirs["receiver_requests"] == 200  # POSTed once each
    assert theirs["duplicates"] == 0

    latency = report["scenarios"]["latency"]
    assert latency["ok"], latency["failures"]
    # pgqueuer runs beside our run with the fewest dispatchers at each rate
    one, two = latency["runs"]
    assert (one["dispatchers"], two["dispatchers"]) == (1, 2)
    assert "baseline" not in two
    assert one["received"] == 100
    theirs = one["baseline"]
    assert theirs["name"] == "pgqueuer"
    assert theirs["offered_rate"] == one["offered_rate"] == 100
    assert theirs["messages"] == theirs["received"] == theirs["delivered"] == 100
    assert theirs["duplicates"] == 0
    assert -50 < theirs["p50_ms"] <= theirs["p95_ms"] <= theirs["p99_ms"] <= theirs["max_ms"]
    assert theirs["max_ms"] < 60_000
    assert theirs["cpu_dispatcher_us_per_msg"] > 0
    assert theirs["p50_ratio"] == pytest.approx(one["p50_ms"] / theirs["p50_ms"])

    measures = {(row["scenario"], row["measure"]) for row in report["table"]}
    assert ("drain-noop", "ours / pgqueuer, median") in measures
    assert ("latency 100/s x1", "ours / pgqueuer, p50") in measures
    assert pgqueuer_schemas(database_url) == []  # installed per run, dropped after
    assert bench_schemas(database_url) == []
    assert not [c for c in child_commands() if "receiver.py" in c]


@pytest.mark.slow
def test_table_shows_targets_and_exit_status_ignores_speed(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            *("bench", "--database-url", database_url, "--scenario", "drain-noop"),
            *("--event-loop", "asyncio", *TINY),
        ]
    )
    out = capsys.readouterr().out

    assert code == 0  # tiny drains miss the throughput target: reported, not failed
    lines = out.splitlines()
    assert "event loop asyncio," in lines[0]
    assert lines[1].split()[:4] == ["scenario", "measure", "value", "target"]
    rate = next(line for line in lines if line.startswith("drain-noop  msgs/s"))
    assert ">= 10,000" in rate
    assert rate.rstrip().endswith(("met", "MISSED"))


@pytest.mark.slow
def test_enqueue_compares_with_the_floor_at_each_worker_count_and_paces_commit_latency(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_bench(
        capsys,
        "--database-url",
        database_url,
        "--scenario",
        "enqueue",
        "--scenario",
        "commit-latency",
        *TINY,
        "--commit-workers",
        "1,2",
    )

    assert code == 0, report
    enqueue = report["scenarios"]["enqueue"]
    assert enqueue["ok"], enqueue["failures"]
    one, two = enqueue["commit_throughput"]
    check_throughput(one, workers=1)
    check_throughput(two, workers=2)
    table = report["table"]
    targets = {row["measure"]: row["target"] for row in table}
    assert targets["1 conns:   outbox (NOTIFY) / floor"] == ">= 0.80"
    assert targets["2 conns:   outbox (NOTIFY) / floor"] == ">= 0.80"

    latency = report["scenarios"]["commit-latency"]
    assert latency["ok"], latency["failures"]
    assert latency["producers"] == 2
    assert [r["dispatcher"] for r in latency["runs"]] == [False, True]
    for run in latency["runs"]:
        assert [r["offered_tx_per_s"] for r in run["rates"]] == [40, 80]
        for rate in run["rates"]:
            # each producer commits its share: half the rate for half a second
            assert (
                rate["committed"]
                == rate["expected"]
                == 2 * round(0.5 * rate["offered_tx_per_s"] / 2)
            )
            assert 0 < rate["p50_ms"] <= rate["p99_ms"] <= rate["max_ms"] < 60_000
            assert rate["p99_from_schedule_ms"] >= 0
            assert rate["client_cpu_us_per_tx"] > 0
    measures = {row["measure"] for row in table}
    assert "80/s, 2 conns, dispatcher on: commit p99 ms" in measures
    assert bench_schemas(database_url) == []
    assert not [c for c in child_commands() if "spawn_main" in c]  # committers ended
