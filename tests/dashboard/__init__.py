"""The operator dashboard served on 127.0.0.1 for a test's database, and a client
that keeps its cookies and reads the CSRF token from its forms."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from dispatchers.runtime.log import EventLog
from dispatchers.ui.app import serve
from dispatchers.ui.auth import Guard
from dispatchers.ui.dashboard import Dashboard, templates
from dispatchers.ui.limits import Limits
from dispatchers.ui.store import DashboardStore
from outbox.sealing import Keyring

ROOT = Path(__file__).resolve().parents[2]

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')

HOSTILE = '<script>alert(1)</script>"><img/src=x/onerror=alert(2)>'
"""A value that runs script wherever a page fails to escape it; without spaces,
so it is a valid event type too."""


@dataclass
class Ui:
    """A running dashboard: its base URL, a client session, its event log, and
    the dashboard itself."""

    url: str
    http: aiohttp.ClientSession
    log: io.StringIO
    dashboard: Dashboard

    async def get(self, path: str, **kwargs: Any) -> tuple[int, str]:
        async with self.http.get(self.url + path, **kwargs) as response:
            return response.status, await response.text()

    async def post(self, path: str, data: dict[str, str]) -> tuple[int, str]:
        async with self.http.post(self.url + path, data=data, allow_redirects=False) as response:
            return response.status, await response.text()

    async def post_location(self, path: str, data: dict[str, str]) -> tuple[int, str]:
        """POST without following a redirect: the status and where it points."""
        async with self.http.post(self.url + path, data=data, allow_redirects=False) as response:
            return response.status, response.headers.get("Location", "")

    async def csrf(self, path: str) -> str:
        """The CSRF token of this session, from the page at ``path`` (one with a form)."""
        status, html = await self.get(path)
        match = _CSRF.search(html)
        if match is None:
            raise AssertionError(f"no CSRF field on {path} ({status})")
        return match[1]

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.log.getvalue().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


@contextlib.asynccontextmanager
async def running(
    database_url: str,
    *,
    token: str | None = None,
    read_only: bool = False,
    keyring: Keyring | None = None,
    limits: Limits | None = None,
    pages: bool = True,
) -> AsyncIterator[Ui]:
    """The dashboard on a free port of 127.0.0.1 until the block ends."""
    log = io.StringIO()
    dashboard = Dashboard(
        store=DashboardStore(database_url, schema="outbox", max_size=2),
        guard=Guard(token=token),
        log=EventLog(stream=log, format="json"),
        templates=templates(),
        read_only=read_only,
        database="test",
        keyring=keyring,
        limits=limits or Limits(),
        pages=pages,
    )
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(dashboard, host="127.0.0.1", port=0, started=listening.set_result)
    )
    try:
        async with asyncio.timeout(30):
            await asyncio.wait({listening, server}, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # serve() failed: raise its error
        jar = aiohttp.CookieJar(unsafe=True)  # keep cookies of an IP address
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            yield Ui(listening.result().rstrip("/"), http, log, dashboard)
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


@contextlib.contextmanager
def serving(argv: list[str], log: Path, *, env: dict[str, str] | None = None) -> Iterator[str]:
    """``outbox *argv`` (a command that ends serving the dashboard, told to listen
    on port 0), with ``env`` added to the environment; yields the dashboard's URL
    once it listens, and stops the command after the block. Its stdout goes to
    ``log``."""
    command = [sys.executable, "-m", "dispatchers.cli", *argv]
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
    stderr = process.stderr
    assert stderr is not None
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while True:
            line = lines.get(timeout=60)
            if line.startswith("outbox ui: serving "):
                yield line.removeprefix("outbox ui: serving ").strip()
                return
    finally:
        process.terminate()
        process.wait(timeout=30)
        reader.join(timeout=10)
        stderr.close()
