"""A raw TCP server on the loopback for tests that need a misbehaving peer."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

Handler = Callable[[socket.socket, threading.Event], None]


# -- servers ---------------------------------------------------------------------------


class RawServer:
    """A TCP listener (127.0.0.1, or ``::1`` for refusal tests) that counts connections
    and hands each to ``handler(conn, closed)`` in its own thread; without a handler a
    connection is closed at once. Every socket call has a timeout; leaving the block
    sets ``closed`` and joins every thread."""

    def __init__(self, handler: Handler | None = None, *, host: str = "127.0.0.1") -> None:
        self.handler = handler
        self.connections = 0
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._accepter = threading.Thread(target=self._accept, daemon=True)

    def url(self, host: str = "127.0.0.1", path: str = "/hook", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5.0)
            if self.handler is not None:
                self.handler(conn, self.closed)

    def __enter__(self) -> Self:
        self._accepter.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.closed.set()
        self._accepter.join(timeout=5)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)


def read_request(conn: socket.socket) -> bytes:
    """Read one request (head and Content-Length body); return its head, or b"" at EOF."""
    return read_message(conn)[0]


def read_message(conn: socket.socket) -> tuple[bytes, bytes]:
    """Read one request; return its head and its Content-Length body, or two empty
    strings at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body
