"""Receivers that misbehave on purpose: huge bodies, endless or trickling responses,
garbage instead of HTTP, redirects, loopback names behind the SSRF guard, sockets
that close at once or never answer.

Each delivery must end as a bounded, classified failure recorded on the message
and its attempt row, and the dispatcher must drain (or stop) within a bound. The
servers are raw sockets on 127.0.0.1, one thread per connection; every blocking
call in them has a timeout and they all return when the test ends.
"""

from __future__ import annotations

import asyncio
import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchers.delivery.retry import ExponentialBackoff
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from tests.database import Db
from tests.dispatching import fast_config
from tests.processes import Fleet, scalar, terminate, wait_until
from tests.rawserver import RawServer, read_request
from tests.timing import LATE

MIB = 1024 * 1024
HUGE = 50 * MIB
BLOCK = 64 * 1024

# One attempt per test: a retry is scheduled a minute out, so --drain stops after it.
ONE_ATTEMPT = ExponentialBackoff(base=60, cap=60, jitter=0)

PATIENT = {"retry_policy": ONE_ATTEMPT, "request_timeout": 10.0, "lease": 20.0}
"""For attempts that something other than the request deadline must end: that
deadline is far enough away that a loaded machine never reaches it first."""


def read_only(conn: socket.socket, closed: threading.Event) -> None:
    """Read the request, answer nothing, close."""
    read_request(conn)


class Recorder(EventLog):
    """Keeps every event in memory, for assertions."""

    def __init__(self) -> None:
        super().__init__(stream=io.StringIO(), format="json", level="debug")
        self.events: list[dict[str, Any]] = []

    def event(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


async def drain_within(db: Db, cfg: DispatcherConfig, bound: float) -> Dispatcher:
    """Run a dispatcher with --drain semantics; fail if it has not finished in ``bound``
    seconds (a generous bound: it proves the drain ends, not how fast)."""
    dispatcher = Dispatcher(db.url, cfg, log=Recorder())
    async with asyncio.timeout(bound):
        await dispatcher.run(drain=True)
    return dispatcher


def message(db: Db, mid: int) -> tuple[Any, ...]:
    """(state, attempts, last_status, last_error, lease_owner) of a message not delivered."""
    (row,) = db.query(
        "SELECT state, attempts, last_status, last_error, lease_owner"
        " FROM outbox.messages WHERE id = %s",
        mid,
    )
    return row


def attempts(db: Db, mid: int) -> list[tuple[Any, ...]]:
    """(attempt, outcome, status, error_class, duration_ms, response_excerpt) rows."""
    return db.query(
        "SELECT attempt, outcome, status, error_class, duration_ms, response_excerpt"
        " FROM outbox.attempts WHERE message_id = %s ORDER BY attempt",
        mid,
    )


def peak_rss(pid: int) -> int:
    """The process's peak resident set size in bytes (VmHWM: what getrusage reports
    as ru_maxrss, for a process that is not our own and still running)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


# -- 1. a 50 MB error body ----------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_50mb_error_body_is_read_only_up_to_the_bound(database_url: str, fleet: Fleet) -> None:
    sent: dict[bytes, int] = {}
    finished = threading.Event()

    def error_with_body(conn: socket.socket, closed: threading.Event) -> None:
        line = read_request(conn)
        size = HUGE if b"/big" in line else 100
        conn.sendall(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
            b"Retry-After: 3600\r\nContent-Length: " + str(size).encode() + b"\r\n\r\n"
        )
        block = b"E" * BLOCK
        count = 0
        try:
            # Streamed from one 64 KiB block: the test never holds 50 MB itself.
            while count < size and not closed.is_set():
                piece = block[: size - count]
                conn.sendall(piece)
                count += len(piece)
        finally:
            sent[line] = count
            if size == HUGE:
                finished.set()

    db = Db(database_url)
    with RawServer(error_with_body) as server:
        small = db.enqueue("body-small", server.url(path="/small"))
        proc = fleet.start(
            database_url,
            *("--request-timeout", "2", "--connect-timeout", "0.5", "--lease", "9"),
            *("--concurrency", "1"),
        )
        probe = "SELECT count(*) FROM outbox.attempts WHERE message_id = %s"
        wait_until(lambda: scalar(database_url, probe, (small,)), timeout=20, what="first attempt")
        # The baseline has imported everything, connected and read one error response.
        before = peak_rss(proc.pid)
        big = db.enqueue("body-big", server.url(path="/big"))
        wait_until(lambda: scalar(database_url, probe, (big,)), timeout=20, what="big attempt")
        after = peak_rss(proc.pid)
        assert finished.wait(10), "the server is still sending"
        terminate(proc)
        assert proc.wait(timeout=20) == 0, proc.describe()

    growth = after - before
    assert growth < 20 * MIB, f"peak RSS grew by {growth / MIB:.1f} MiB"
    # The dispatcher stopped reading and closed: most of the body was never taken.
    big_sent = next(v for k, v in sent.items() if b"/big" in k)
    assert big_sent < HUGE // 2, f"the server sent {big_sent / MIB:.1f} MiB"
    assert message(db, big)[:3] == ("ready", 1, 500)
    ((number, outcome, status, error_class, _, excerpt),) = attempts(db, big)
    assert (number, outcome, status, error_class) == (1, "retry", 500, "http_500")
    assert excerpt == "E" * 1024  # excerpt_bytes, the default


# -- 2. bodies that never end ---------------------------------------------------------


async def test_endless_chunked_200_succeeds_once_the_read_bound_is_hit(db: Db) -> None:
    """A 2xx status arrived; the body is only read up to max_response_bytes, then the
    connection is dropped. Success is right: the receiver accepted the request, and
    nothing past the bound is ever looked at."""

    def endless(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"1000\r\n" + b"c" * 0x1000 + b"\r\n"
        while not closed.is_set():
            conn.sendall(chunk)

    with RawServer(endless) as server:
        mid = db.enqueue("endless-200", server.url())
        dispatcher = await drain_within(db, fast_config(PATIENT), 15)
    assert dispatcher.stats.delivered == 1
    assert db.query("SELECT id, attempts, last_status FROM outbox.delivered") == [(mid, 1, 200)]
    ((_, outcome, status, error_class, duration_ms, excerpt),) = attempts(db, mid)
    assert (outcome, status, error_class) == ("delivered", 200, None)
    assert duration_ms < 10_000  # the read bound ended it, not the request deadline
    assert excerpt == "c" * 1024


async def test_trickling_200_body_times_out_and_is_retried(db: Db) -> None:
    """Headers of a 200, then one byte of body every 0.2 s forever. Each read makes
    progress, so only the per-attempt deadline ends it; the attempt then counts as
    a timeout and is retried (at least once: the receiver dedupes by key), although
    the status was 2xx."""

    def trickle(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not closed.wait(0.2):
            conn.sendall(b"1\r\nx\r\n")

    with RawServer(trickle) as server:
        mid = db.enqueue("trickle-200", server.url())
        dispatcher = await drain_within(db, fast_config(retry_policy=ONE_ATTEMPT), 15)
    assert dispatcher.stats.retried == 1
    assert message(db, mid)[:3] == ("ready", 1, None)
    ((_, outcome, status, error_class, duration_ms, _),) = attempts(db, mid)
    assert (outcome, status, error_class) == ("retry", None, "timeout")
    assert 1000 - 10 <= duration_ms < (1 + LATE) * 1000  # the deadline (1 s) ended it


# -- 3. not HTTP, or too slow to be -----------------------------------------------------


async def test_garbage_instead_of_a_status_line_is_a_protocol_error(db: Db) -> None:
    def garbage(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        conn.sendall(b"\x16\x03\x01\x00\xa5 SSH-2.0-not-http \xff\xfe\r\n\r\n")

    with RawServer(garbage) as server:
        mid = db.enqueue("garbage", server.url())
        dispatcher = await drain_within(db, fast_config(PATIENT), 15)
    assert dispatcher.stats.retried == 1
    state, count, status, error, _ = message(db, mid)
    assert (state, count, status) == ("ready", 1, None)
    assert error.startswith("protocol error")
    assert [r[1:4] for r in attempts(db, mid)] == [("retry", None, "protocol_error")]


async def test_slowloris_status_line_is_cut_at_the_request_timeout(db: Db) -> None:
    """One byte of the status line per second: every read succeeds within httpx's
    per-read timeout, so only the overall deadline per attempt ends it."""
    request_timeout = 2.5

    def slowloris(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            conn.sendall(bytes([byte]))
            if closed.wait(1.0):
                return

    cfg = fast_config(request_timeout=request_timeout, lease=6.0, retry_policy=ONE_ATTEMPT)
    with RawServer(slowloris) as server:
        mid = db.enqueue("slowloris", server.url())
        dispatcher = await drain_within(db, cfg, 15)
    assert dispatcher.stats.retried == 1
    assert message(db, mid)[:3] == ("ready", 1, None)
    ((_, outcome, status, error_class, duration_ms, _),) = attempts(db, mid)
    assert (outcome, status, error_class) == ("retry", None, "timeout")
    # the whole answer would take 40 s: the deadline ended the attempt
    assert request_timeout * 1000 - 10 <= duration_ms < (request_timeout + LATE) * 1000


# -- 4. redirects and the SSRF guard ------------------------------------------------------


async def test_redirects_fail_permanently_and_are_never_followed(db: Db) -> None:
    with RawServer(read_only) as target:

        def redirect(conn: socket.socket, closed: threading.Event) -> None:
            line = read_request(conn)
            location = target.url(path="/") if b"/to-loopback" in line else "http://10.0.0.1/"
            conn.sendall(
                b"HTTP/1.1 302 Found\r\nLocation: " + location.encode() + b"\r\n"
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )

        with RawServer(redirect) as server:
            private = db.enqueue("redirect-private", server.url(path="/to-private"))
            loopback = db.enqueue("redirect-loopback", server.url(path="/to-loopback"))
            # The guard on, loopback allowed: even a followed redirect could reach
            # nothing beyond 127.0.0.1.
            cfg = fast_config(
                PATIENT, allow_private_networks=False, allow_networks=("127.0.0.0/8",)
            )
            dispatcher = await drain_within(db, cfg, 15)
            requests = server.connections
        assert target.connections == 0
    assert requests == 2
    assert dispatcher.stats.dead == 2
    for mid in (private, loopback):
        state, count, status, error, _ = message(db, mid)
        assert (state, count, status) == ("dead", 1, 302)
        assert error == "redirect not followed (HTTP 302)"
        assert [r[1:4] for r in attempts(db, mid)] == [("failed", 302, "redirect")]


async def test_a_name_resolving_to_loopback_is_blocked_before_connecting(db: Db) -> None:
    with RawServer(read_only) as server:
        mid = db.enqueue("ssrf-localhost", f"http://localhost:{server.port}/hook")
        dispatcher = await drain_within(db, fast_config(allow_private_networks=False), 15)
        assert server.connections == 0
    # held unsent rather than dead (it used to be dead at once): no attempt spent
    assert (dispatcher.stats.blocked, dispatcher.stats.dead) == (1, 0)
    state, count, status, error, _ = message(db, mid)
    assert (state, count, status) == ("ready", 0, None)
    assert "'localhost'" in error
    assert attempts(db, mid) == []


# -- 5. sockets that close at once or never answer -----------------------------------------


async def test_a_server_that_closes_at_once_is_retried(db: Db) -> None:
    with RawServer() as server:
        mid = db.enqueue("closes-at-once", server.url())
        dispatcher = await drain_within(db, fast_config(PATIENT), 15)
        assert server.connections >= 1
    assert dispatcher.stats.retried == 1
    assert message(db, mid)[:3] == ("ready", 1, None)
    ((_, outcome, status, error_class, duration_ms, _),) = attempts(db, mid)
    assert (outcome, status) == ("retry", None)
    # EOF before a response, or a reset if the close raced the request
    assert error_class in ("protocol_error", "network_error")
    assert duration_ms < 10_000  # the close ended it, before the request deadline


async def test_a_server_that_never_answers_is_cut_at_the_request_timeout(db: Db) -> None:
    def silent(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        closed.wait(30)

    with RawServer(silent) as server:
        mid = db.enqueue("never-answers", server.url())
        dispatcher = await drain_within(db, fast_config(retry_policy=ONE_ATTEMPT), 15)
    assert dispatcher.stats.retried == 1
    assert message(db, mid)[:3] == ("ready", 1, None)
    ((_, outcome, status, error_class, duration_ms, _),) = attempts(db, mid)
    assert (outcome, status, error_class) == ("retry", None, "timeout")
    # the server would hold on for 30 s: the deadline (1 s) ended the attempt
    assert 1000 - 10 <= duration_ms < (1 + LATE) * 1000
