"""A PostgreSQL proxy that freezes its client right after a chosen statement.

It listens on a Unix socket (``<directory>/.s.PGSQL.5432``) and forwards every
connection to the real server. It reads the client's bytes as PostgreSQL protocol
messages, and the first time a statement containing ``marker`` has fully gone
out (a simple ``Query`` message, or a ``Parse`` and then its ``Execute``), it
calls ``on_trigger`` (which sends the client SIGSTOP) and forwards nothing more
from that connection until :meth:`FreezeProxy.release`. The server thus sees
exactly what it would if the client had frozen just after writing that
statement, whatever the client wrote after it.

Threads and blocking sockets; every wait is bounded and :meth:`close` ends them.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

_STARTUP_CODES = {196608}  # protocol 3.0
_PRE_STARTUP_CODES = {80877103, 80877104, 80877102}  # SSL, GSSENC, cancel
HOLD_LIMIT = 120.0
"""The longest a frozen connection's bytes are held if nobody releases them."""


class FreezeProxy:
    def __init__(
        self,
        upstream: str | tuple[str, int],
        directory: Path,
        marker: bytes,
        on_trigger: Callable[[], None],
    ) -> None:
        self.upstream = upstream
        self.directory = directory
        self.path = directory / ".s.PGSQL.5432"
        self.marker = marker
        self.on_trigger = on_trigger
        self.triggered = threading.Event()
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(64)
        self._closed = False
        self._spawn(self._accept_loop)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.upstream)
            return sock
        return socket.create_connection(self.upstream, timeout=5)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = self._connect_upstream()
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            self._spawn(self._to_server, client, server)
            self._spawn(self._to_client, server, client)

    def _to_client(self, server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def _to_server(self, client: socket.socket, server: socket.socket) -> None:
        buffer = b""
        started = False
        statement_parsed = False  # a Parse with the marker went out; waiting for Execute
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                buffer += data
                while True:
                    if not started:
                        if len(buffer) < 8:
                            break
                        (length,) = struct.unpack("!I", buffer[:4])
                        if len(buffer) < length:
                            break
                        (code,) = struct.unpack("!I", buffer[4:8])
                        message, buffer = buffer[:length], buffer[length:]
                        server.sendall(message)
                        started = code in _STARTUP_CODES or code not in _PRE_STARTUP_CODES
                        continue
                    if len(buffer) < 5:
                        break
                    kind = buffer[:1]
                    (length,) = struct.unpack("!I", buffer[1:5])
                    if len(buffer) < 1 + length:
                        break
                    message, buffer = buffer[: 1 + length], buffer[1 + length :]
                    server.sendall(message)
                    if self.triggered.is_set():
                        continue
                    freeze = False
                    if kind == b"Q" and self.marker in message:
                        freeze = True
                    elif kind == b"P" and self.marker in message:
                        statement_parsed = True
                    elif kind == b"E" and statement_parsed:
                        freeze = True
                    if freeze:
                        with self._lock:
                            first = not self.triggered.is_set()
                            self.triggered.set()
                        if first:
                            self.on_trigger()
                            self.released.wait(HOLD_LIMIT)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self._closed = True
        self.released.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in threads:
            thread.join(5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> FreezeProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
