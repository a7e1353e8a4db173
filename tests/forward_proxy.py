"""A small HTTP forward proxy for tests, on the test's event loop.

It serves ``CONNECT host:port`` (a tunnel: it pipes bytes both ways and never
sees inside TLS) and absolute-form requests (``POST http://host:port/path``,
sent on in origin form without the ``Proxy-*`` headers), and records what it
was asked for each, with the ``Proxy-Authorization`` it was given. With
``credentials`` set it answers 407 to a request without them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Forwarded:
    """What a client asked the proxy for."""

    method: str
    target: str  # host:port for CONNECT, the absolute URL otherwise
    authorization: str | None


class ForwardProxy:
    """``async with ForwardProxy() as proxy: ... proxy.url ... proxy.forwarded``

    :param host: the address it listens on (a loopback one besides 127.0.0.1,
        so that a test can tell the proxy's address from the destination's).
    """

    def __init__(self, host: str = "127.0.0.2", credentials: tuple[str, str] | None = None) -> None:
        self.host = host
        self.forwarded: list[Forwarded] = []
        self._expected = None
        if credentials is not None:
            self._expected = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *lines = [line for line in head.split("\r\n") if line]
        method, target, version = request_line.split(" ")
        headers = [line.split(":", 1) for line in lines]
        authorization = next(
            (value.strip() for name, value in headers if name.lower() == "proxy-authorization"),
            None,
        )
        self.forwarded.append(Forwarded(method, target, authorization))
        if self._expected is not None and authorization != self._expected:
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream_reader, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = urlsplit(target)
            assert url.hostname is not None
            upstream_reader, upstream = await asyncio.open_connection(url.hostname, url.port or 80)
            path = url.path + (f"?{url.query}" if url.query else "")
            kept = [
                f"{name}:{value}"
                for name, value in headers
                if not name.lower().startswith("proxy-")
            ]
            upstream.write(
                "\r\n".join([f"{method} {path} {version}", *kept, "", ""]).encode("latin-1")
            )
        try:
            await asyncio.gather(_pipe(reader, upstream), _pipe(upstream_reader, writer))
        finally:
            upstream.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then end ``sink``."""
    while chunk := await source.read(65536):
        sink.write(chunk)
        await sink.drain()
    with contextlib.suppress(OSError):
        sink.write_eof()
