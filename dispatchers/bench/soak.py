"""The ``soak`` scenario: a steady load for minutes against a receiver that fails and
stalls now and then, with one dispatcher process restarted every interval.

Only a message lost, dead or accepted twice, or a dispatcher that fails, fails
the run; growth of memory or of the ``messages`` table is reported as a verdict.

The module stays whole: it is one scenario, whose restarts, checks and verdicts
read the same run's state.

Design: docs/explanation/design/benchmarks.md
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from psycopg.rows import dict_row

from dispatchers.bench import SOAK_SECONDS
from dispatchers.bench.context import Bench
from dispatchers.bench.env import (
    bench_queries,
    bench_statement,
    connect,
    fresh_schema,
    payload,
    run_id,
)
from dispatchers.bench.measure import MB, percentile
from dispatchers.bench.receiver import Replies
from dispatchers.bench.receiver_process import ReceiverProcess
from dispatchers.bench.results import SoakInterval, SoakResult, Trend
from dispatchers.runtime.config import DispatcherConfig
from outbox import Outbox

DISPATCH = (sys.executable, "-m", "dispatchers.cli", "dispatch")
STOP_TIMEOUT = DispatcherConfig.grace + 20.0

READY_TIMEOUT = 60.0
"""Seconds a restarted dispatcher may take to connect (its interpreter start
included) before it is stopped anyway: a SIGTERM before the command has set its
handlers kills it (exit -15), which says nothing about how it stops."""
"""Seconds a dispatcher may take to exit after SIGTERM: its grace period, and time
to release what it holds."""
DRAIN_TIMEOUT = 120.0
"""Seconds after the load stops for the last messages (and their retries) to arrive."""
FLAT_RATIO = 1.10
"""A figure is flat when its peak after the warm-up is at most this times its peak
during the warm-up (plus a small absolute slack: a few pages, a few MB)."""
RSS_SLACK_MB = 4.0
TABLE_SLACK_MB = 0.25


def trend(values: list[float | None], *, slack: float) -> Trend:
    """Whether ``values`` (one per interval) are flat after the warm-up: the first
    third of the intervals (at least one). Too few values to have a "later" part, or
    none measured, leave the verdict open (None)."""
    present = [v for v in values if v is not None]
    warmup = max(1, len(present) // 3)
    if len(present) <= warmup:
        return Trend(warmup_intervals=warmup, warmup_peak=None, later_peak=None, flat=None)
    before, after = max(present[:warmup]), max(present[warmup:])
    return Trend(
        warmup_intervals=warmup,
        warmup_peak=before,
        later_peak=after,
        flat=after <= before * FLAT_RATIO + slack,
    )


class _Producer:
    """Commits one message per transaction, ``rate`` per second, in a thread of its
    own until stopped; ``commits`` maps each key to the wall time (``time.time()``)
    right after its commit, as the receiver stamps arrivals."""

    def __init__(self, url: str, schema: str, target: str, prefix: str, rate: float) -> None:
        self.url = url
        self.box = Outbox(schema=schema, notify=True)
        self.target = target
        self.prefix = prefix
        self.rate = rate
        self.commits: dict[str, float] = {}
        self.late_max = 0.0
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-bench-soak-producer")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()

    def _run(self) -> None:
        box = self.box
        try:
            with connect(self.url) as conn:
                start = time.monotonic()
                i = 0
                while not self._stop.is_set():
                    delay = start + i / self.rate - time.monotonic()
                    if delay > 0:
                        if self._stop.wait(delay):
                            break
                    else:
                        self.late_max = max(self.late_max, -delay)
                    key = f"{self.prefix}{i}"
                    box.enqueue(conn, url=self.target, idempotency_key=key, json=payload(i))
                    conn.commit()
                    self.commits[key] = time.time()
                    i += 1
        except Exception as exc:  # the scenario reports it as a failure
            self.error = exc


class _Dispatcher:
    """One ``outbox dispatch`` process; its stderr goes to a file, shown if it fails.
    Its sessions carry ``name`` as their application name."""

    def __init__(self, argv: list[str], log: Path, name: str) -> None:
        self.argv = argv
        self.log = log
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PGAPPNAME": self.name}
        with open(self.log, "ab") as err:
            # our own interpreter and module, with fixed arguments
            self.process = subprocess.Popen(  # noqa: S603
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
            )

    def wait_connected(self, url: str, timeout: float) -> bool:
        """Wait until the process has a session on the server (it has started, and
        stops on SIGTERM as the command does); False if it exited or ``timeout``
        passed first."""
        deadline = time.monotonic() + timeout
        with connect(url, autocommit=True) as conn:
            while self.exit_code() is None and time.monotonic() < deadline:
                row = conn.execute(
                    bench_statement("sessions_named"), {"name": self.name}
                ).fetchone()
                if row is not None and row[0] > 0:
                    return True
                time.sleep(0.05)
        return False

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def rss(self) -> int | None:
        """The process's resident set size in bytes now (``VmRSS``), None if gone."""
        if self.process is None:
            return None
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    def stop(self, timeout: float) -> int | None:
        """SIGTERM, then wait up to ``timeout`` seconds (SIGKILL after); the exit
        code, or None if it had to be killed."""
        process = self.process
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return None

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-1000:]
        return ""


class _Run:
    """One soak in progress: its schema, receiver, producer and dispatchers, and the
    marks between intervals."""

    def __init__(self, bench: Bench, schema: str, receiver: ReceiverProcess, logs: Path) -> None:
        s = bench.settings
        self.bench = bench
        self.schema = schema
        self.receiver = receiver
        self.prefix = f"soak-{run_id()}-"
        self.producer = _Producer(bench.db.url, schema, receiver.url, self.prefix, s.soak_rate)
        argv = [
            *DISPATCH,
            *("--database-url", bench.db.url, "--schema", schema),
            *("--allow-private-networks", "--log-format", "json", "--log-level", "warning"),
            *("--event-loop", s.event_loop),
            *(("--http-client", s.http_client) if s.http_client else ()),
        ]
        self.fleet = [
            _Dispatcher(argv, logs / f"dispatcher-{n + 1}.log", f"{self.prefix}dispatcher-{n + 1}")
            for n in range(s.soak_dispatchers)
        ]
        self.failures: list[str] = []
        self.restart_stops: list[float] = []
        self.started = 0.0
        self.mark = 0.0
        self.counted: dict[str, Any] = {}
        self.committed = 0

    def start(self) -> None:
        for dispatcher in self.fleet:
            dispatcher.start()
        self.counted = self.receiver.counts()
        self.started = time.monotonic()
        self.mark = time.time()
        self.producer.start()

    def wait_until(self, end: float) -> bool:
        """Sleep until ``end`` (monotonic); False as soon as a dispatcher exits on its
        own (noted as a failure) or the producer fails."""
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(0.5, left))
            for number, dispatcher in enumerate(self.fleet, 1):
                if (code := dispatcher.exit_code()) is not None:
                    self.failures.append(
                        f"dispatcher {number} exited with {code}: {dispatcher.stderr_tail()}"
                    )
                    return False
            if self.producer.error is not None:
                return False
        return True

    def measure(self, number: int, monitor: Any) -> SoakInterval:
        """The interval since the last mark: what arrived in it (each arrival falls in
        exactly one interval), how late, and the sizes now."""
        now = time.time()
        arrived = self.receiver.arrivals(self.prefix, since=self.mark)
        window = [(key, at) for key, at in arrived.items() if at < now]
        commits = self.producer.commits
        lags = [(at - commits[key]) * 1000 for key, at in window if key in commits]
        counts = self.receiver.counts()
        committed = len(commits)
        sizes = monitor.execute(
            bench_queries(self.schema)["hot_table_sizes"], {"schema": self.schema}
        ).fetchone()
        interval = SoakInterval(
            number=number,
            end_s=time.monotonic() - self.started,
            committed=committed - self.committed,
            delivered=len(window),
            failed_requests=counts["failed"] - self.counted["failed"],
            delayed_requests=counts["delayed"] - self.counted["delayed"],
            lag_p50_ms=percentile(lags, 50),
            lag_p99_ms=percentile(lags, 99),
            rss_mb=[None if (rss := d.rss()) is None else rss / MB for d in self.fleet],
            messages_mb=sizes["total_bytes"] / MB,
            messages_indexes_mb=sizes["index_bytes"] / MB,
        )
        self.mark, self.counted, self.committed = now, counts, committed
        return interval

    def restart_last(self) -> None:
        """SIGTERM the last dispatcher, wait for it to exit, start it again."""
        dispatcher = self.fleet[-1]
        dispatcher.wait_connected(self.bench.db.url, READY_TIMEOUT)
        began = time.monotonic()
        code = dispatcher.stop(STOP_TIMEOUT)
        self.restart_stops.append(time.monotonic() - began)
        if code != 0:
            self.failures.append(
                f"dispatcher {len(self.fleet)} exited with {code} on SIGTERM: "
                f"{dispatcher.stderr_tail()}"
            )
        dispatcher.start()

    def drain(self) -> None:
        """Stop the load; wait until every committed message has arrived, or
        :data:`DRAIN_TIMEOUT` has passed."""
        self.producer.stop()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        committed = len(self.producer.commits)
        # the receiver is this soak's alone: every key it counts is one of ours
        while self.receiver.counts()["distinct_keys"] < committed:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def outcome(self, monitor: Any) -> tuple[int, int, int, int]:
        """Of the committed messages: (delivered, still being retried, dead, lost)."""
        arrived = self.receiver.arrivals(self.prefix)
        missing = [key for key in self.producer.commits if key not in arrived]
        states: dict[str, int] = {}
        if missing:
            for row in monitor.execute(
                bench_queries(self.schema)["soak_states"], {"keys": missing}
            ).fetchall():
                states[row["state"]] = row["count"]
        retrying = states.get("ready", 0) + states.get("running", 0)
        dead = states.get("dead", 0)
        delivered = len(self.producer.commits) - len(missing)
        return delivered, retrying, dead, len(missing) - retrying - dead

    def stop(self) -> None:
        """End the producer and every dispatcher (SIGTERM, as an operator would)."""
        self.producer.stop()
        for number, dispatcher in enumerate(self.fleet, 1):
            running = dispatcher.exit_code() is None
            code = dispatcher.stop(STOP_TIMEOUT)
            if running and code != 0:
                self.failures.append(f"dispatcher {number} exited with {code} on SIGTERM")


def soak(bench: Bench) -> SoakResult:
    """A steady ``soak_rate`` for ``duration`` (default :data:`SOAK_SECONDS`), one
    row per ``soak_interval``; see the module's docstring."""
    s = bench.settings
    duration = s.offered_seconds(SOAK_SECONDS)
    count = max(1, math.ceil(duration / s.soak_interval))
    replies = Replies(
        delay=s.soak_slow_delay, delay_share=s.soak_slow_share, fail_share=s.soak_fail_share
    )
    bench.progress(
        f"soak: {s.soak_rate:g} msgs/s for {duration:g} s, {s.soak_dispatchers} dispatcher "
        f"processes (the last restarted every {s.soak_interval:g} s); the receiver answers "
        f"{s.soak_fail_share:.0%} of requests 500 and {s.soak_slow_share:.0%} "
        f"{s.soak_slow_delay:g} s late"
    )
    intervals: list[SoakInterval] = []
    with (
        fresh_schema(bench.db.url) as schema,
        ReceiverProcess(replies=replies) as receiver,
        tempfile.TemporaryDirectory(prefix="outbox-soak-") as logs,
        connect(bench.db.url, autocommit=True) as monitor,
    ):
        monitor.row_factory = dict_row
        run = _Run(bench, schema, receiver, Path(logs))
        try:
            run.start()
            for number in range(1, count + 1):
                if not run.wait_until(run.started + min(number * s.soak_interval, duration)):
                    break
                interval = run.measure(number, monitor)
                intervals.append(interval)
                bench.progress(_progress_line(interval, count))
                if number < count:
                    run.restart_last()
            run.drain()
        finally:
            run.stop()
        delivered, retrying, dead, lost = run.outcome(monitor)
        final = receiver.counts()
    committed = len(run.producer.commits)
    failures = run.failures
    if run.producer.error is not None:
        failures.append(f"the producer failed: {run.producer.error!r}")
    if lost:
        failures.append(f"{lost} committed messages neither arrived nor wait for a retry")
    if dead:
        failures.append(f"{dead} messages went dead")
    if final["duplicates"]:
        failures.append(f"the receiver took {final['duplicates']} keys twice")
    elapsed = intervals[-1].end_s if intervals else None
    steady = range(len(run.fleet) - 1)  # every dispatcher but the restarted last one
    return SoakResult(
        offered_rate=s.soak_rate,
        achieved_rate=committed / elapsed if elapsed else None,
        dispatchers=s.soak_dispatchers,
        interval_s=s.soak_interval,
        duration_s=duration,
        fail_share=s.soak_fail_share,
        slow_share=s.soak_slow_share,
        slow_delay_s=s.soak_slow_delay,
        producer_late_max_ms=run.producer.late_max * 1000,
        committed=committed,
        delivered=delivered,
        retrying=retrying,
        dead=dead,
        lost=lost,
        duplicates=final["duplicates"],
        failed_requests=final["failed"],
        delayed_requests=final["delayed"],
        restarts=len(run.restart_stops),
        restart_stop_max_s=max(run.restart_stops, default=None),
        intervals=intervals,
        rss=[trend([i.rss_mb[n] for i in intervals], slack=RSS_SLACK_MB) for n in steady],
        messages_size=trend([i.messages_mb for i in intervals], slack=TABLE_SLACK_MB),
        ok=not failures,
        failures=failures,
    )


def _progress_line(i: SoakInterval, count: int) -> str:
    rss = ", ".join("gone" if mb is None else f"{mb:,.0f}" for mb in i.rss_mb)
    lag = "n/a" if i.lag_p99_ms is None else f"{i.lag_p99_ms:,.0f}"
    return (
        f"soak: {i.number}/{count} at {i.end_s:,.0f} s: committed {i.committed:,}, "
        f"delivered {i.delivered:,}, lag p99 {lag} ms, RSS {rss} MB, messages table "
        f"{i.messages_mb:.2f} MB (indexes {i.messages_indexes_mb:.2f} MB)"
    )
