"""While its database is down, ``outbox ui`` answers every surface at once: the
management API with a 503 problem, the dashboard and the consumer portal with a
page saying the database is unreachable (503), none of them hanging on a
connection that will not come; and when the database is back, each serves
again by itself, without a restart."""

from __future__ import annotations

import functools
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.api import make_token
from tests.conftest import PgServer
from tests.dashboard import serving
from tests.portal import link, tenant
from tests.processes import wait_until

pytestmark = pytest.mark.timeout(180)

ANSWER_WITHIN = 15.0
"""How long an answer may take while the database is down: well past the
surfaces' own wait for a connection (5 s), well short of the 30 s they hung."""

BACK_WITHIN = 60.0
"""How long the surfaces may take to serve again once the database is back."""


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    retry_after: str | None
    text: str
    seconds: float


def _get(url: str, token: str | None = None) -> Answer:
    """GET ``url``, whatever the status; the client waits longer than any bound
    here, so that a surface that hangs is seen hanging, not cut short."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=90) as response:  # ours, on loopback
            status, headers_, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as refused:
        with refused:
            status, headers_, body = refused.code, refused.headers, refused.read()
    return Answer(
        status,
        headers_.get_content_type(),
        headers_.get("Retry-After"),
        body.decode(),
        time.monotonic() - started,
    )


def _serves(url: str, token: str | None) -> bool:
    return _get(url, token).status == 200


def test_every_surface_answers_503_at_once_while_the_database_is_down_and_serves_again_after(
    pg_server: PgServer, database_url: str, tmp_path: Path
) -> None:
    if not pg_server.restartable:
        pytest.skip("needs a server the tests started (OUTBOX_TEST_DATABASE_URL is set)")
    token = make_token(database_url, "read", name="monitor")
    tenant(database_url, "acme")
    portal = link(database_url, "acme").url_path.lstrip("/")
    argv = ["ui", "--port", "0", "--database-url", database_url]
    with serving(argv, tmp_path / "ui.log") as base:
        surfaces: dict[str, tuple[str, str | None]] = {
            "dashboard": (base, None),
            "api": (base + "api/v1/status", token),
            "portal": (base + portal, None),
        }
        for name, (url, given) in surfaces.items():
            assert _get(url, given).status == 200, name

        pg_server.stop()
        try:
            down = {name: _get(url, given) for name, (url, given) in surfaces.items()}
        finally:
            pg_server.start()

        for name, answer in down.items():
            assert answer.status == 503, (name, answer)
            assert answer.seconds < ANSWER_WITHIN, (name, answer.seconds)
            assert answer.retry_after == "5", (name, answer)
        problem = json.loads(down["api"].text)
        assert down["api"].content_type == "application/problem+json"
        assert problem["type"] == "urn:outbox:problem:unavailable"
        assert problem["status"] == 503
        assert "database is unreachable" in problem["detail"]
        assert down["dashboard"].content_type == "text/html"
        assert "The database is unreachable" in down["dashboard"].text
        assert down["portal"].content_type == "text/html"
        assert "cannot reach its database" in down["portal"].text
        # the portal's page shows nothing of the dashboard's (its database's name)
        assert "Overview" not in down["portal"].text

        back = time.monotonic()
        for name, (url, given) in surfaces.items():
            wait_until(
                functools.partial(_serves, url, given),
                timeout=BACK_WITHIN - (time.monotonic() - back),
                what=f"the {name} serving again once the database is back",
            )
        assert "<h1>Overview</h1>" in _get(base).text
        assert json.loads(_get(base + "api/v1/status", token).text)["messages"]["dead"] == 0
