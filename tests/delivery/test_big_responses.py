"""Responses with huge bodies, through both HTTP clients and a real dispatcher.

A receiver may answer with far more than anyone asked for (a file, an error page
that never ends). The outcome depends on the status alone; the body is read only
up to ``max_response_bytes`` (its first ``excerpt_bytes`` kept), and the rest is
never taken: the connection is closed instead. The server here streams a 64 MiB
body from one 64 KiB block with a small send buffer, and counts the bytes the
socket accepted before the client closed: the client's kernel buffers hold a few
MiB at most, so a count far below the body's length shows the client stopped.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import pytest

from dispatchers.delivery.http import Sender
from dispatchers.delivery.retry import ExponentialBackoff
from tests.database import Db
from tests.dispatching import drain, fast_config
from tests.rawserver import Handler, RawServer, read_request

MIB = 1024 * 1024
HUGE = 64 * MIB
BLOCK = b"b" * (64 * 1024)
STOPPED_BY = 16 * MIB
"""The most the server may have sent of a body the client stopped reading: the
read bound, plus the kernel's buffers on both ends (a few MiB on the loopback)."""

# One attempt per message: a retry is due a minute later, so the drain ends first.
ONE_ATTEMPT = ExponentialBackoff(base=60, cap=60, jitter=0)


@dataclass
class HugeBodies:
    """Answers ``/ok`` with a 200 and anything else with a 503, each with a
    ``HUGE`` body; records how much of each body was sent, by path."""

    sent: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def __call__(self, conn: socket.socket, closed: threading.Event) -> None:
        head = read_request(conn)
        path = head.split(b" ")[1].decode()
        status = b"200 OK" if path == "/ok" else b"503 Service Unavailable"
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, len(BLOCK))
        count = 0
        try:
            conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n" % HUGE)
            while count < HUGE and not closed.is_set():
                conn.sendall(BLOCK)  # raises once the client has closed
                count += len(BLOCK)
        finally:
            with self.lock:
                self.sent[path] = count
            self.done.release()

    def wait(self, responses: int, within: float) -> None:
        deadline = time.monotonic() + within
        for _ in range(responses):
            if not self.done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"the server still sends after {within:g} s: {self.sent}")


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
async def test_a_huge_body_is_classified_by_status_and_read_only_up_to_the_bound(
    database_url: str, http_client: str
) -> None:
    db = Db(database_url)
    server = HugeBodies()
    with RawServer(server) as raw:
        ok = db.enqueue("huge-ok", raw.url(path="/ok"))
        failing = db.enqueue("huge-503", raw.url(path="/fail"))
        dispatcher = await drain(
            db,
            fast_config(
                http_client=http_client, retry_policy=ONE_ATTEMPT, request_timeout=5.0, lease=10.0
            ),
        )
        server.wait(2, within=10)

    assert (dispatcher.stats.delivered, dispatcher.stats.retried) == (1, 1)
    assert db.query("SELECT id, attempts, last_status FROM outbox.delivered") == [(ok, 1, 200)]
    assert db.query(
        "SELECT state, attempts, last_status FROM outbox.messages WHERE id = %s", failing
    ) == [("ready", 1, 503)]
    excerpts = db.query(
        "SELECT message_id, outcome, status, response_excerpt FROM outbox.attempts"
        " ORDER BY message_id"
    )
    # each classified by its status, not cut as a timeout: the read bound ended each
    # read, not the request deadline
    assert excerpts == [(ok, "delivered", 200, "b" * 1024), (failing, "retry", 503, "b" * 1024)]
    for path, sent in server.sent.items():
        assert sent < STOPPED_BY, f"{path}: the server sent {sent / MIB:.1f} MiB"


def keep_alive_reply(body: bytes) -> Handler:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    def handler(conn: socket.socket, closed: threading.Event) -> None:
        while not closed.is_set() and read_request(conn):
            conn.sendall(reply)

    return handler


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
@pytest.mark.slow
async def test_only_the_excerpt_is_kept_though_the_body_is_read_to_the_bound(
    http_client: str,
) -> None:
    """A body within the bound is read to its end (so its connection is reused) but
    only its first ``excerpt_bytes`` are returned: nothing more is held."""
    body = bytes(range(256)) * 3
    cfg = fast_config(
        http_client=http_client, max_response_bytes=1000, excerpt_bytes=100, concurrency=1
    )
    sender = Sender(cfg)
    try:
        with RawServer(keep_alive_reply(body)) as raw:
            for _ in range(3):
                status, _, data = await sender.client.request(
                    "POST", raw.url(), headers={}, body=b"{}"
                )
                assert (status, data) == (200, body[:100])
            assert raw.connections == 1
    finally:
        await sender.aclose()
