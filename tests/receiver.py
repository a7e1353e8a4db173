"""A real HTTP receiver on 127.0.0.1 for tests: records every request and answers
as the test tells it (status, headers, delay, or a connection reset)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0
    reset: bool = False


Responder = Callable[[Received], Reply]


class Receiver:
    """``with Receiver() as r: ... r.url ... r.requests``"""

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda req: Reply())
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Received(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    time.monotonic(),
                )
                with receiver.arrived:
                    receiver.requests.append(req)
                    receiver.arrived.notify_all()
                reply = receiver.responder(req)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.reset:
                    # RST instead of FIN: SO_LINGER with a zero timeout.
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.close_connection = True
                    return
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET = _handle

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        """Block until at least ``count`` requests arrived (or fail after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.requests) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(self.requests)} of {count} requests arrived")
                self.arrived.wait(remaining)
            return list(self.requests)


class ConcurrencyMeter:
    """Counts requests in progress per path; remembers the peak."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def __call__(self, req: Received) -> Reply:
        with self.lock:
            self.active[req.path] = self.active.get(req.path, 0) + 1
            self.peak[req.path] = max(self.peak.get(req.path, 0), self.active[req.path])
        time.sleep(self.delay)
        with self.lock:
            self.active[req.path] -= 1
        return Reply()
