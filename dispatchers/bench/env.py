"""What every benchmark needs: a database, a fresh schema, a backlog, CPU clocks.

- :func:`database` yields the given database, or a throwaway embedded PostgreSQL in
  a temporary directory (removed afterwards).
- :func:`fresh_schema` migrates a schema with a random name and drops it afterwards.
- :func:`seed_backlog` writes ready messages with the real ``enqueue`` statement,
  pipelined (``executemany``), since the drain is what is timed, not the writing.
- :class:`CpuClock` reads the CPU time of a process (and its children) from
  ``/proc``; :func:`postgres_clock` finds the server's postmaster when the server
  runs on this host, so PostgreSQL's CPU per message can be reported.
- :func:`bench_queries` gives the benchmark's own SQL (``dispatchers/bench/queries.sql``,
  loaded as all named statements are) bound to one schema; :func:`bench_statement`
  one of them that names no schema.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import class_row

from dispatchers.embedded import Database, EmbeddedPostgres
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA
from outbox.dsn import libpq_url
from outbox.internal import build_message, catalog, check_schema_name, queries_for
from outbox.migrations import load_migrations, migrate

CONNECT_TIMEOUT = 10  # seconds, for the benchmark's own connections
STATEMENT_TIMEOUT = "300s"  # for the benchmark's own statements (seeding history is slow)
SEED_COMMIT_EVERY = 5000
SPAWN = multiprocessing.get_context("spawn")
"""How the benchmarks start their other processes (fresh interpreters, no fork)."""


@dataclass(frozen=True)
class ReceiverSeen:
    """What the bench receiver saw between two of its counts."""

    requests: int
    duplicates: int


def receiver_check(
    before: dict[str, Any], after: dict[str, Any], messages: int
) -> tuple[ReceiverSeen, list[str]]:
    """What the bench receiver saw between two of its counts, and the failures of a
    run that should have sent each of ``messages`` exactly once."""
    seen = ReceiverSeen(
        after["requests"] - before["requests"], after["duplicates"] - before["duplicates"]
    )
    failures = []
    if seen.requests != messages:
        failures.append(f"receiver saw {seen.requests} requests, expected {messages}")
    if seen.duplicates:
        failures.append(f"receiver saw {seen.duplicates} duplicate keys")
    return seen, failures


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A connection for the benchmark's own work, with its waits bounded."""
    conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT)
    conn.execute(bench_statement("statement_timeout"), {"timeout": STATEMENT_TIMEOUT})
    if not autocommit:
        conn.commit()
    return conn


@contextmanager
def database(url: str | None) -> Iterator[Database]:
    """The given database, or a throwaway embedded server in a temporary directory."""
    if url:
        yield Database(libpq_url(url), embedded=False)
        return
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        server = EmbeddedPostgres(os.path.join(tmp, "pg"), delete=True)
        try:
            yield Database(server.url, embedded=True)
        finally:
            server.cleanup()


@contextmanager
def fresh_schema(
    url: str, prefix: str = "outbox_bench", *, version: int | None = None
) -> Iterator[str]:
    """A newly migrated schema with a random name, dropped (with all it holds) after;
    with ``version``, migrated only that far (to measure against an earlier schema)."""
    schema = check_schema_name(f"{prefix}_{uuid.uuid4().hex[:12]}")
    try:
        migrate(url, schema=schema, migrations=load_migrations()[:version])
        yield schema
    finally:
        with connect(url, autocommit=True) as conn:
            conn.execute(bench_queries(schema)["drop_schema"])


def run_id() -> str:
    """A short random tag that keeps the keys of one run apart from every other's."""
    return uuid.uuid4().hex[:8]


def payload(i: int) -> dict[str, Any]:
    """The JSON body of benchmark message ``i``: a small, typical webhook."""
    return {"order_id": i, "amount_cents": 1299, "currency": "EUR", "status": "paid"}


def message_params(target: str, key: str, i: int) -> dict[str, Any]:
    """The ``enqueue`` statement's parameters for benchmark message ``i``, built and
    validated as ``Outbox.enqueue`` builds them."""
    message = build_message(
        url=target,
        idempotency_key=key,
        json=payload(i),
        body=None,
        content_type=None,
        method="POST",
        headers=None,
        ordering_key=None,
        available_at=None,
        max_attempts=None,
        default_max_attempts=DEFAULT_MAX_ATTEMPTS,
        max_body_bytes=1 << 20,
    )
    return message.params()


def seed_backlog(url: str, schema: str, *, targets: Sequence[str], keys: list[str]) -> None:
    """Write one ready message per key, to each of ``targets`` in turn, as
    ``Outbox.enqueue`` would.

    Each message is validated by the same builder and written by the same
    ``enqueue`` statement as ``Outbox.enqueue``; the statements are pipelined
    (``executemany``) and committed every ``SEED_COMMIT_EVERY`` messages.
    """
    statement = queries_for(schema)["enqueue"]
    with connect(url) as conn, conn.cursor() as cur:
        for start in range(0, len(keys), SEED_COMMIT_EVERY):
            params = [
                message_params(targets[i % len(targets)], key, i)
                for i, key in enumerate(keys[start : start + SEED_COMMIT_EVERY], start)
            ]
            cur.executemany(statement.text, params)
            conn.commit()


@dataclass(frozen=True)
class RowCounts:
    """Rows in the claimable table and in the history of one schema."""

    messages: int
    delivered: int


def row_counts(url: str, schema: str) -> RowCounts:
    """Where the messages of ``schema`` are: still queued, or delivered."""
    with connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=class_row(RowCounts))
        counts = cur.execute(bench_queries(schema)["row_counts"]).fetchone()
    if counts is None:
        raise RuntimeError("the row counts returned no row")
    return counts


# -- the benchmark's own SQL ----------------------------------------------------------

QUERIES = Path(__file__).with_name("queries.sql")
"""The benchmark's own statements (shipped in the wheel with the package)."""


def bench_queries(schema: str) -> dict[str, str]:
    """The benchmark's statements (``queries.sql``) bound to ``schema`` (the
    loader caches them)."""
    queries = catalog(schema, (QUERIES,))
    return {name: queries[name].text for name in queries.names()}


def bench_statement(name: str) -> str:
    """One of the benchmark's statements that names no schema (so the schema its
    text is bound to makes no difference)."""
    return bench_queries(DEFAULT_SCHEMA)[name]


# -- CPU time from /proc -------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class _Stat:
    state: str
    ppid: int
    own: float  # user + system CPU seconds
    reaped: float  # user + system CPU seconds of the children it has waited for


def _stat(pid: int) -> _Stat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after it
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return _Stat(fields[0], int(fields[1]), (utime + stime) / _TICKS, (cutime + cstime) / _TICKS)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents.setdefault(stat.ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class CpuClock:
    """The CPU time (user + system, seconds) a process has used, read from /proc.

    With ``tree``, the process's live descendants and the children it has reaped
    count too (PostgreSQL: the postmaster, every backend and background process).
    A child that has exited but is not yet reaped (a zombie) shows no CPU time in
    /proc, so the reading waits (up to ``settle`` seconds) until there is none.
    """

    def __init__(self, pid: int, *, tree: bool = False, settle: float = 2.0) -> None:
        self.pid = pid
        self.tree = tree
        self.settle = settle

    def read(self) -> float | None:
        deadline = time.monotonic() + self.settle
        while True:
            stat = _stat(self.pid)
            if stat is None:
                return None
            if not self.tree:
                return stat.own
            children = [s for s in map(_stat, _descendants(self.pid)) if s is not None]
            if any(s.state == "Z" for s in children) and time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            # a child that exited since the scan is in the reaped times, read last
            live = sum(s.own for s in children if s.state != "Z")
            after = _stat(self.pid)
            reaped = after.reaped if after is not None else stat.reaped
            return stat.own + reaped + live


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def postgres_clock(url: str) -> CpuClock | None:
    """A clock on the server's postmaster and all its children, when the server runs
    on this host and is visible in /proc (a Unix socket or a loopback address);
    None otherwise (then PostgreSQL's CPU is not reported)."""
    if not Path("/proc/self/stat").exists():
        return None
    with connect(url, autocommit=True) as conn:
        host = conn.info.host
        if not (host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")):
            return None
        backend = conn.info.backend_pid
        stat = _stat(backend)
        if stat is None or "postgres" not in _cmdline(backend):
            return None  # another PID namespace (a container), or not readable
        postmaster = stat.ppid
    if "postgres" not in _cmdline(postmaster) and "postmaster" not in _cmdline(postmaster):
        return None
    return CpuClock(postmaster, tree=True)
