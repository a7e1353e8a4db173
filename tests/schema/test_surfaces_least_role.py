"""Every command that the least-privilege table (``docs/how-to/operating.md``)
names a least role for runs as that role, granted by
``outbox roles --apply`` and nothing more: ``outbox ui`` (its pages, its API and
the consumer portal) and ``outbox ui --api-only`` start and answer with data as
the operator, ``outbox status`` reports as the operator, and ``outbox dispatch
--drain`` delivers as the dispatcher what the producer enqueued."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from dispatchers.cli import main
from outbox import Outbox
from outbox.endpoints import Endpoints
from outbox.errors import SchemaNotMigrated
from outbox.tenants import Tenants
from tests.conftest import PgServer
from tests.dashboard import serving
from tests.processes import Fleet
from tests.receiver import Receiver
from tests.schema.test_roles import Roles, grant_all, made_roles

pytestmark = pytest.mark.timeout(120)

HOOK = "https://example.com/acme-hook"


@pytest.fixture
def roles(
    pg_server: PgServer, database_url: str, capsys: pytest.CaptureFixture[str]
) -> Iterator[Roles]:
    """The three roles, granted exactly what ``outbox roles --apply`` grants."""
    with made_roles(pg_server, database_url) as made:
        grant_all(database_url, made, capsys)
        yield made


def _outbox(url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``outbox *argv`` in-process against ``url``: it must succeed; its stdout."""
    capsys.readouterr()
    code = main([*argv, "--database-url", url])
    out, err = capsys.readouterr()
    assert code == 0, (argv, err)
    return out


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:  # ours, on loopback
        body: bytes = response.read()
        return response.status, body.decode()


def _tenant_endpoint(database_url: str) -> int:
    """A tenant, ``acme``, with one endpoint (made as the schema's owner)."""
    with psycopg.connect(database_url) as conn:
        Tenants().add(conn, "acme", name="Acme")
        return Endpoints().add(conn, url=HOOK, tenant="acme").id


@pytest.mark.slow
def test_outbox_ui_serves_its_pages_api_and_portal_as_the_operator(
    database_url: str, roles: Roles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = _tenant_endpoint(database_url)
    as_operator = roles.urls["operator"]
    token = _outbox(as_operator, capsys, "api-tokens", "create", "--scope", "read").strip()
    link = _outbox(as_operator, capsys, "portal-link", "--tenant", "acme").strip()
    portal = urlsplit(link).path.lstrip("/")
    argv = ["ui", "--port", "0", "--database-url", as_operator]
    with serving(argv, tmp_path / "ui.log") as base:
        status, page = _get(base)
        assert status == 200 and "<h1>Overview</h1>" in page
        status, page = _get(base + "endpoints")
        assert status == 200 and HOOK in page
        status, page = _get(base + f"endpoints/{endpoint}")
        assert status == 200 and HOOK in page
        status, text = _get(base + "api/v1/endpoints", token)
        assert status == 200
        assert [e["url"] for e in json.loads(text)["items"]] == [HOOK]
        status, page = _get(base + portal)
        assert status == 200 and HOOK in page


@pytest.mark.slow
def test_outbox_ui_api_only_serves_the_api_as_the_operator(
    database_url: str, roles: Roles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _tenant_endpoint(database_url)
    as_operator = roles.urls["operator"]
    token = _outbox(as_operator, capsys, "api-tokens", "create", "--scope", "read").strip()
    argv = ["ui", "--api-only", "--port", "0", "--database-url", as_operator]
    with serving(argv, tmp_path / "ui.log") as base:
        status, text = _get(base + "api/v1/endpoints", token)
        assert status == 200
        assert [e["url"] for e in json.loads(text)["items"]] == [HOOK]
        status, text = _get(base + "api/v1/status", token)
        assert status == 200 and json.loads(text)["messages"]["dead"] == 0


def test_outbox_status_reports_as_the_operator(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    _tenant_endpoint(database_url)
    with psycopg.connect(roles.urls["producer"]) as conn:
        Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1", tenant="acme")
    report: dict[str, Any] = json.loads(_outbox(roles.urls["operator"], capsys, "status", "--json"))
    assert report["messages"]["ready"] == 1, report


@pytest.mark.slow
def test_outbox_dispatch_drain_delivers_as_the_dispatcher(
    database_url: str, roles: Roles, receiver: Receiver, tmp_path: Path
) -> None:
    with psycopg.connect(roles.urls["producer"]) as conn:
        Outbox().enqueue(conn, url=receiver.url + "/orders", idempotency_key="o-1", json={"n": 1})
    with Fleet(tmp_path) as fleet:
        drain = fleet.start(roles.urls["dispatcher"], "--drain")
        assert drain.wait(timeout=60) == 0, drain.describe()
    assert [(r.path, json.loads(r.body)) for r in receiver.requests] == [("/orders", {"n": 1})]


@pytest.mark.parametrize(
    ("undone", "behind"),
    [
        # the newest migration not applied: migrated by an older version
        (
            "DELETE FROM outbox.schema_migrations"
            " WHERE version = (SELECT max(version) FROM outbox.schema_migrations)",
            True,
        ),
        ("DROP SCHEMA outbox CASCADE", False),
    ],
)
def test_outbox_ui_as_the_operator_refuses_a_schema_not_at_this_version_in_one_line(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], undone: str, behind: bool
) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(undone.encode())
    capsys.readouterr()
    code = main(["ui", "--port", "0", "--database-url", roles.urls["operator"]])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err == f"outbox ui: {SchemaNotMigrated('outbox', behind=behind)}\n"
