"""The consumer portal served on 127.0.0.1 for a test's database (mounted on the
dashboard as ``outbox ui`` mounts it), tenants with links, and a client."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import psycopg

from dispatchers.portal.app import MOUNT, build_portal
from dispatchers.runtime.log import EventLog
from dispatchers.ui.app import serve
from dispatchers.ui.auth import Guard
from dispatchers.ui.dashboard import Dashboard, templates
from dispatchers.ui.store import DashboardStore
from outbox.endpoints import Endpoints
from outbox.portal import PortalLink, create_link
from outbox.sealing import Keyring
from outbox.tenants import Tenants

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Served:
    """A running dashboard with its portal: the base URL (no final slash), a
    client without cookies, and the event log."""

    url: str
    http: aiohttp.ClientSession
    log: io.StringIO

    async def get(self, path: str, **kwargs: Any) -> tuple[int, str]:
        async with self.http.get(self.url + path, allow_redirects=False, **kwargs) as response:
            return response.status, await response.text()

    async def response(self, method: str, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """The response (read) with its headers."""
        async with self.http.request(
            method, self.url + path, allow_redirects=False, **kwargs
        ) as response:
            await response.read()
            return response

    async def post(self, path: str, data: dict[str, str]) -> tuple[int, str, str]:
        """POST without following a redirect: status, body, Location."""
        async with self.http.post(self.url + path, data=data, allow_redirects=False) as response:
            return response.status, await response.text(), response.headers.get("Location", "")

    async def csrf(self, path: str) -> str:
        status, html = await self.get(path)
        match = _CSRF.search(html)
        if match is None:
            raise AssertionError(f"no CSRF field on {path} ({status})")
        return match[1]

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.log.getvalue().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


@contextlib.asynccontextmanager
async def serving(
    database_url: str,
    *,
    ancestors: tuple[str, ...] = ("'none'",),
    read_only: bool = False,
    keyring: Keyring | None = None,
) -> AsyncIterator[Served]:
    """The dashboard and its portal on a free port of 127.0.0.1 until the block ends."""
    log = io.StringIO()
    dashboard = Dashboard(
        store=DashboardStore(database_url, schema="outbox", max_size=2),
        guard=Guard(token=None),
        log=EventLog(stream=log, format="json"),
        templates=templates(),
        read_only=read_only,
        database="test",
        keyring=keyring,
    )
    mounts = {MOUNT: build_portal(dashboard, ancestors=ancestors)}
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(dashboard, host="127.0.0.1", port=0, started=listening.set_result, mounts=mounts)
    )
    try:
        async with asyncio.timeout(30):
            await asyncio.wait({listening, server}, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            yield Served(listening.result().rstrip("/"), http, log)
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


def tenant(url: str, external_id: str, **kwargs: Any) -> None:
    with psycopg.connect(url) as conn:
        Tenants().add(conn, external_id, **kwargs)


def link(url: str, external_id: str, **kwargs: Any) -> PortalLink:
    with psycopg.connect(url) as conn:
        return create_link(conn, tenant=external_id, **kwargs)


def endpoint(url: str, external_id: str | None, target: str = "https://example.com/wh") -> int:
    with psycopg.connect(url) as conn:
        return Endpoints().add(conn, url=target, tenant=external_id).id


def expire(url: str, made: PortalLink) -> None:
    """Make the link expire now, as its time running out would."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox.portal_links SET created_at = now() - interval '1 hour',"
            " expires_at = now() - interval '1 second' WHERE id = %s",
            (made.id,),
        )
