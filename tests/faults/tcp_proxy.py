"""A TCP proxy on 127.0.0.1 that a test can break on command.

It forwards every connection to a Unix socket or a TCP address, and the test can:

- :meth:`TcpProxy.cut`: abort every current connection at once (the client gets
  a reset, the server side is closed abruptly, nothing in flight is flushed);
- :meth:`TcpProxy.refuse`: reset every new connection for a while;
- :meth:`TcpProxy.stall`: forward nothing, either way, on any connection (new ones
  too) for a while; nothing is lost, the bytes flow again afterwards;
- :meth:`TcpProxy.cut_on`: cut the connection that sends a statement containing
  some text, either before the statement reaches the server (``"request"``: it
  never runs) or once the server has answered it (``"reply"``: it ran and
  committed, and the answer is lost). The text is looked for in the bytes the
  client sends, which carry the SQL in the PostgreSQL Parse or Query message.

The proxy runs its own asyncio loop in a daemon thread; every method is called
from the test's thread and waits at most :data:`CALL_TIMEOUT` for the loop to act.
Buffers are bounded (one read of at most 64 KiB per direction at a time, with
back-pressure), and :meth:`TcpProxy.stop` closes everything and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

T = TypeVar("T")

CHUNK = 64 * 1024
CALL_TIMEOUT = 5.0
"""The longest a test waits for the proxy's loop to carry out a command."""

READY_IDLE = b"Z\x00\x00\x00\x05I"
"""PostgreSQL's ReadyForQuery message, outside a transaction: the server has
finished the client's pipeline, up to and including its COMMIT and Sync."""


@dataclass(frozen=True)
class UnixTarget:
    path: str


@dataclass(frozen=True)
class TcpTarget:
    host: str
    port: int


Target = UnixTarget | TcpTarget
CutMode = Literal["request", "reply"]


def _reset_on_close(writer: asyncio.StreamWriter) -> None:
    """Make closing this TCP socket send RST instead of FIN (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@dataclass
class _Rule:
    pattern: bytes
    mode: CutMode
    remaining: int


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream, with the two pumps between them."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    armed: _Rule | None = None  # a "reply" rule waiting for the server's answer
    tails: dict[bool, bytes] = field(default_factory=lambda: {True: b"", False: b""})

    def abort(self) -> None:
        _reset_on_close(self.client)
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    def seen(self, to_server: bool, data: bytes, longest: int) -> bytes:
        """``data`` preceded by the end of the previous chunk in the same
        direction, so a pattern split across two reads is still found."""
        window = self.tails[to_server] + data
        self.tails[to_server] = window[-longest:] if longest else b""
        return window


@dataclass
class ProxyStats:
    accepted: int = 0
    refused: int = 0
    cut: int = 0  # connections aborted by cut()
    cut_on: int = 0  # connections aborted by a cut_on() rule
    stalls: int = 0


class TcpProxy:
    """``with TcpProxy(UnixTarget(path)) as proxy: ... proxy.port ... proxy.cut()``"""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.stats = ProxyStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._rules: list[_Rule] = []
        self._refuse_until = 0.0
        self._flowing: asyncio.Event | None = None
        self._resume: asyncio.TimerHandle | None = None
        self.port = 0

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self.port = self._call(self._listen)
        return self

    def stop(self) -> None:
        """Close the listener and every connection; join the loop's thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CALL_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def url(self, database: str, user: str = "postgres") -> str:
        """A PostgreSQL URL that connects through the proxy."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    # -- faults ----------------------------------------------------------------------

    def cut(self) -> int:
        """Abort every current connection, both sides; return how many there were."""

        async def cut() -> int:
            links = list(self._links)
            self._links.clear()
            for link in links:
                link.abort()
            self.stats.cut += len(links)
            return len(links)

        return self._call(cut)

    def cut_on(self, pattern: bytes, *, mode: CutMode, times: int = 1) -> None:
        """Cut the next ``times`` connections that send ``pattern`` (see the module)."""

        async def add() -> None:
            self._rules.append(_Rule(pattern, mode, times))

        self._call(add)

    def rules_pending(self) -> int:
        """Cuts that :meth:`cut_on` rules still have to make."""

        async def count() -> int:
            return sum(rule.remaining for rule in self._rules)

        return self._call(count)

    def refuse(self, seconds: float) -> None:
        """Reset every connection that arrives in the next ``seconds``."""

        async def refuse() -> None:
            self._refuse_until = time.monotonic() + seconds

        self._call(refuse)

    def stall(self, seconds: float) -> None:
        """Forward nothing, either way, on any connection, for ``seconds``; returns at once."""

        async def stall() -> None:
            assert self._flowing is not None
            self.stats.stalls += 1
            self._flowing.clear()
            if self._resume is not None:
                self._resume.cancel()
            self._resume = self._loop.call_later(seconds, self._flowing.set)

        self._call(stall)

    def stalled(self) -> bool:
        async def stalled() -> bool:
            return self._flowing is not None and not self._flowing.is_set()

        return self._call(stalled)

    def connections(self) -> int:
        """Connections open through the proxy right now."""

        async def count() -> int:
            return len(self._links)

        return self._call(count)

    # -- the loop's side -----------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        # stopped: finish what is left, so that nothing is destroyed while pending
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def wrapped() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(wrapped(), self._loop)
        return future.result(timeout=CALL_TIMEOUT)

    async def _listen(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, backlog=128)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        self._links.clear()
        if self._flowing is not None:
            self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if time.monotonic() < self._refuse_until:
            self.stats.refused += 1
            _reset_on_close(writer)
            writer.transport.abort()
            return
        link = _Link(writer)
        self._links.add(link)
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                if isinstance(self.target, UnixTarget):
                    up_reader, up_writer = await asyncio.open_unix_connection(self.target.path)
                else:
                    up_reader, up_writer = await asyncio.open_connection(
                        self.target.host, self.target.port
                    )
        except (OSError, TimeoutError):
            self._links.discard(link)
            link.abort()
            return
        if link not in self._links:  # cut while connecting upstream
            up_writer.transport.abort()
            return
        link.upstream = up_writer
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer, to_server=True)),
            asyncio.create_task(self._pump(link, up_reader, writer, to_server=False)),
        ]
        try:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            if link in self._links:
                # one side ended on its own: close the other side gently
                self._links.discard(link)
                for w in (writer, up_writer):
                    with contextlib.suppress(Exception):
                        w.close()

    def _cut_link(self, link: _Link) -> None:
        if link in self._links:
            self._links.discard(link)
            self.stats.cut_on += 1
        link.abort()

    def _match(self, link: _Link, data: bytes, *, to_server: bool) -> bool:
        """Apply the cut_on rules to a chunk; True if the link was cut (drop the chunk)."""
        longest = max([len(r.pattern) for r in self._rules] + [len(READY_IDLE)])
        window = link.seen(to_server, data, longest - 1)
        if not to_server:
            if link.armed is not None and READY_IDLE in window:
                link.armed = None
                self._cut_link(link)
                return True
            return False
        for rule in self._rules:
            if rule.remaining > 0 and rule.pattern in window:
                rule.remaining -= 1
                if rule.mode == "request":
                    self._cut_link(link)
                    return True
                link.armed = rule
                link.tails[False] = b""  # only an answer that comes after this counts
                return False
        return False

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_server: bool,
    ) -> None:
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                # a stall that began while this read waited holds the bytes back too
                await self._flowing.wait()
                if link not in self._links or self._match(link, data, to_server=to_server):
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # the other pump stops on its own once its peer sees the end
            with contextlib.suppress(Exception):
                if link in self._links and writer.can_write_eof():
                    writer.write_eof()


# -- a database behind the proxy ---------------------------------------------------------


def proxy_target(database_url: str) -> Target:
    """Where the test database listens: the embedded server's Unix socket, or TCP."""
    parts = urlsplit(database_url)
    host = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    port = parts.port or 5432
    if not host or host.startswith("/"):
        return UnixTarget(os.path.join(host or "/var/run/postgresql", f".s.PGSQL.{port}"))
    return TcpTarget(host, port)


def through(proxy: TcpProxy, database_url: str) -> str:
    """``database_url`` (same user, password and database) via the proxy."""
    parts = urlsplit(database_url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials or 'postgres'}@127.0.0.1:{proxy.port}"
    return urlunsplit(("postgresql", netloc, parts.path, "", ""))
