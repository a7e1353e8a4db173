"""The management API against a real database, over real HTTP on 127.0.0.1:
tokens and scopes, every resource's routes, pages, problem details naming the
field with nothing written, the audit log, read-only mode, and the commands
(``outbox api-tokens``, ``outbox ui --api-only``)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatchers.api.fingerprints import fingerprint
from dispatchers.api.routes import ROUTES
from dispatchers.cli import main
from outbox.migrations import migrate
from outbox.portal import find_link
from outbox.secrets import fingerprint as secret_fingerprint
from tests.api import Client, make_token, serving_api
from tests.conftest import PgServer
from tests.dashboard import running, serving
from tests.database import Db
from tests.schema.test_roles import grant_all, made_roles

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def _count(db: Db, table: str) -> int:
    ((n,),) = db.query(f"SELECT count(*) FROM outbox.{table}")
    return int(n)


def _audit(db: Db) -> list[dict[str, Any]]:
    found = db.query("SELECT to_jsonb(a) FROM outbox.audit_log AS a ORDER BY id")
    return [row[0] for row in found]


async def _endpoint(api: Client, **fields: Any) -> dict[str, Any]:
    answer = await api.call(
        "POST", "/endpoints", json_body={"url": "https://example.com/hook", **fields}
    )
    assert answer.status == 201, answer.body
    return dict(answer.body)


async def test_a_request_without_a_valid_token_is_refused_and_learns_nothing(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        for token in (None, "", "obx_short", "Bearer-ish", "obx_" + "A" * 43):
            headers = {} if token is None else {"Authorization": f"Bearer {token}"}
            answer = await Client(api.ui, None).call("GET", "/endpoints", headers=headers)
            assert answer.status == 401
            assert answer.problem["type"] == "urn:outbox:problem:unauthenticated"
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        basic = await Client(api.ui, None).call(
            "GET", "/endpoints", headers={"Authorization": "Basic dXNlcjpwYXNz"}
        )
        assert basic.status == 401
        # refused before validation: a bad body of a request without a token is a 401
        unsigned = await Client(api.ui, None).call("POST", "/endpoints", json_body={"url": 1})
        assert unsigned.status == 401
        # the document needs no token: it says only what the API is
        assert (await Client(api.ui, None).call("GET", "/openapi.json")).status == 200


async def test_a_read_token_reads_and_may_not_write_anything(db: Db, database_url: str) -> None:
    reader = make_token(database_url, "read", name="dashboards")
    async with serving_api(database_url) as api:
        await _endpoint(api)
        before = _count(db, "endpoints"), _count(db, "audit_log")
        read = api.as_token(reader)
        me = await read.call("GET", "/token")
        assert me.body == {
            "id": me.body["id"],
            "name": "dashboards",
            "scope": "read",
            "tenant": None,
        }
        assert (await read.call("GET", "/endpoints")).status == 200
        for method, path, body in [
            ("POST", "/endpoints", {"url": "https://example.com/x"}),
            ("PATCH", "/endpoints/1", {"description": "x"}),
            ("DELETE", "/endpoints/1", None),
            ("POST", "/dead/purge", {"all": True}),
            ("PUT", "/event-types/a", {"retry_schedule": [1]}),
        ]:
            answer = await read.call(method, path, json_body=body)
            assert answer.status == 403, (method, path)
            assert "write scope" in answer.problem["detail"]
        assert (_count(db, "endpoints"), _count(db, "audit_log")) == before


async def test_a_revoked_token_is_refused_at_its_next_request(
    db: Db, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving_api(database_url) as api:
        assert (await api.call("GET", "/token")).status == 200
        token_id = (await api.call("GET", "/token")).body["id"]
        assert main(["api-tokens", "revoke", str(token_id), "--database-url", database_url]) == 0
        assert f"revoked token {token_id}" in capsys.readouterr().out
        answer = await api.call("GET", "/token")
        assert answer.status == 401 and "revoked" in answer.problem["detail"]


async def test_an_endpoints_life_through_the_api_is_audited_by_fingerprint_without_secrets(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        created = await _endpoint(
            api, event_types=["order.*"], description="shop", metadata={"team": "a"}
        )
        secret, endpoint_id = created.pop("secret"), created["id"]
        assert secret.startswith("whsec_")
        shown = await api.call("GET", f"/endpoints/{endpoint_id}")
        assert shown.body == created
        assert shown.body["secrets"][0]["fingerprint"] == secret_fingerprint(secret)
        assert secret not in json.dumps(shown.body)

        changed = await api.call(
            "PATCH", f"/endpoints/{endpoint_id}", json_body={"rate_limit": 5, "burst": 2}
        )
        assert (changed.body["rate_limit_per_s"], changed.body["burst"]) == (5.0, 2)
        cleared = await api.call(
            "PATCH", f"/endpoints/{endpoint_id}", json_body={"rate_limit": None}
        )
        assert (cleared.body["rate_limit_per_s"], cleared.body["burst"]) == (None, None)
        assert cleared.body["description"] == "shop"  # absent: kept

        test = await api.call("POST", f"/endpoints/{endpoint_id}/test")
        assert test.status == 200
        disabled = await api.call(
            "POST", f"/endpoints/{endpoint_id}/disable", json_body={"reason": "maintenance"}
        )
        assert disabled.body["paused"] == 1
        assert disabled.body["endpoint"]["disabled_reason"] == "maintenance"
        enabled = await api.call("POST", f"/endpoints/{endpoint_id}/enable")
        assert enabled.body["resumed"] == 1 and enabled.body["endpoint"]["enabled"]

        before_rotation = (await api.call("GET", f"/endpoints/{endpoint_id}")).body
        rotated = await api.call(
            "POST", f"/endpoints/{endpoint_id}/rotate-secret", json_body={"overlap_hours": 1}
        )
        new_secret = rotated.body["secret"]
        assert new_secret != secret and rotated.body["previous_secrets_expire_at"]
        after_rotation = (await api.call("GET", f"/endpoints/{endpoint_id}")).body
        assert [s["fingerprint"] for s in after_rotation["secrets"]] == [
            secret_fingerprint(new_secret),
            secret_fingerprint(secret),
        ]

        deleted = await api.call("DELETE", f"/endpoints/{endpoint_id}")
        assert deleted.body == {"id": endpoint_id, "messages": 1}
        assert (await api.call("GET", f"/endpoints/{endpoint_id}")).status == 404

        audit = await api.call("GET", "/audit")
    entries = audit.body["items"][::-1]
    assert [e["action"] for e in entries] == [
        "create", "update", "update", "test", "disable", "enable", "rotate-secret", "delete",
    ]  # fmt: skip
    assert {e["token_name"] for e in entries} == {"test operator"}
    assert entries[0]["before_sha256"] is None
    assert entries[0]["after_sha256"] == fingerprint(created)
    rotation = entries[6]
    assert rotation["before_sha256"] == fingerprint(before_rotation)
    assert rotation["after_sha256"] == fingerprint(after_rotation)
    assert entries[-1]["after_sha256"] is None
    stored = json.dumps(_audit(db))
    assert secret not in stored and new_secret not in stored


async def test_a_refused_request_names_the_field_and_writes_nothing(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        cases: list[tuple[str, str, dict[str, Any], str]] = [
            ("POST", "/endpoints", {"url": "ftp://example.com/"}, "body.url"),
            ("POST", "/endpoints", {"url": "https://user:pw@example.com/"}, "body.url"),
            ("POST", "/endpoints", {"url": "https://x.example/", "description": "a\x00b"},
             "body.description"),
            ("POST", "/endpoints", {"url": "https://x.example/", "filter": "(("}, "body.filter"),
            ("POST", "/endpoints", {"url": "https://x.example/", "secret": "whsec_" + "A" * 33},
             "body.secret"),
            ("POST", "/endpoints", {"url": "https://x.example/", "max_concurrency": 0},
             "body.max_concurrency"),
            ("POST", "/endpoints", {"url": "https://x.example/", "max_concurrency": "3"},
             "body.max_concurrency"),
            ("POST", "/endpoints", {"url": "https://x.example/", "extra": 1}, "body.extra"),
            ("PUT", "/destinations", {"destination": "https://x.example", "burst": 3},
             "body.burst"),
            ("PUT", "/destinations", {"destination": "https://x.example"}, "body.rate_limit"),
        ]  # fmt: skip
        before = _count(db, "endpoints"), _count(db, "audit_log")
        for method, path, body, field in cases:
            answer = await api.call(method, path, json_body=body)
            assert answer.status == 400, (body, answer.body)
            assert answer.problem["field"] == field, (body, answer.body)
            assert answer.problem["errors"][0]["field"] == field
        for params, field in [
            ({"limit": "201"}, "query.limit"),
            ({"limit": "0"}, "query.limit"),
            ({"cursor": "nonsense"}, "query.cursor"),
            ({"nope": "1"}, "query.nope"),
        ]:
            answer = await api.call("GET", "/endpoints", params=params)
            assert answer.status == 400 and answer.problem["field"] == field
        other_list = (await api.call("GET", "/messages", params={"limit": "1"})).body
        assert other_list["next_cursor"] is None
        twice = await api.call("GET", "/endpoints?limit=1&limit=2")
        assert twice.status == 400 and twice.problem["field"] == "query.limit"
        assert (await api.call("GET", "/endpoints/0")).problem["field"] == "path.id"
        not_json = await api.call(
            "POST", "/endpoints", data=b"url=https://x", headers={"Content-Type": "text/plain"}
        )
        assert not_json.status == 415
        broken = await api.call(
            "POST", "/endpoints", data=b"{", headers={"Content-Type": "application/json"}
        )
        assert broken.status == 400 and broken.problem["field"] == "body"
        huge = await api.call(
            "POST",
            "/endpoints",
            json_body={"url": "https://x.example/", "description": "x" * 300_000},
        )
        assert huge.status == 413
        assert (_count(db, "endpoints"), _count(db, "audit_log")) == before


async def test_lists_are_pages_that_a_cursor_walks_without_overlap(
    db: Db, database_url: str
) -> None:
    messages = [db.enqueue(f"key-{i}") for i in range(5)]
    async with serving_api(database_url) as api:
        ids = [(await _endpoint(api))["id"] for _ in range(5)]

        async def walk(path: str) -> list[list[int]]:
            pages, cursor = [], None
            while True:
                params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
                body = (await api.call("GET", path, params=params)).body
                pages.append([item["id"] for item in body["items"]])
                cursor = body["next_cursor"]
                if cursor is None:
                    return pages

        assert await walk("/endpoints") == [ids[0:2], ids[2:4], ids[4:]]
        assert await walk("/messages") == [messages[:2:-1], messages[2:0:-1], messages[:1]]
        default = (await api.call("GET", "/endpoints")).body
        assert len(default["items"]) == 5 and default["next_cursor"] is None


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


async def test_a_cursor_altered_or_forged_is_refused_naming_the_cursor(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        ids = [(await _endpoint(api))["id"] for _ in range(3)]
        cursor = (await api.call("GET", "/endpoints", params={"limit": "1"})).body["next_cursor"]
        walked = await api.call("GET", "/endpoints", params={"limit": "1", "cursor": cursor})
        assert [e["id"] for e in walked.body["items"]] == [ids[1]]
        # the JSON a cursor holds, edited to start the page elsewhere, or made anew
        held = _b64(json.dumps({"k": "endpoints", "id": ids[0]}, separators=(",", ":")))
        wanted = _b64(json.dumps({"k": "endpoints", "id": ids[1]}, separators=(",", ":")))
        assert cursor.startswith(held)
        edited = wanted + cursor[len(held) :]
        for bad in (edited, wanted, cursor + "A", cursor[:5] + "!" + cursor[5:]):
            answer = await api.call("GET", "/endpoints", params={"limit": "1", "cursor": bad})
            assert answer.status == 400, (bad, answer.body)
            assert answer.problem["field"] == "query.cursor"
        messages = await api.call("GET", "/messages", params={"limit": "1", "cursor": cursor})
        assert messages.status == 400 and messages.problem["field"] == "query.cursor"


def _cursor_key(url: str) -> bytes:
    ((key,),) = Db(url).query("SELECT key FROM outbox.api_cursor_key")
    return bytes(key)


@pytest.mark.slow
async def test_a_cursor_works_on_every_server_of_its_database_and_is_refused_by_another(
    db: Db, database_url: str, empty_database_url: str
) -> None:
    migrate(empty_database_url, schema="outbox")  # made apart: a key of its own
    elsewhere = empty_database_url
    assert len(_cursor_key(elsewhere)) == 32
    assert _cursor_key(elsewhere) != _cursor_key(database_url)
    async with serving_api(database_url) as first, running(database_url) as other:
        second = Client(other, first.token)
        ids = [(await _endpoint(first))["id"] for _ in range(3)]
        cursor = (await first.call("GET", "/endpoints", params={"limit": "1"})).body["next_cursor"]
        walked = await second.call("GET", "/endpoints", params={"limit": "1", "cursor": cursor})
        assert walked.status == 200, walked.body
        assert [e["id"] for e in walked.body["items"]] == [ids[1]]
        back = await first.call(
            "GET", "/endpoints", params={"limit": "1", "cursor": walked.body["next_cursor"]}
        )
        assert [e["id"] for e in back.body["items"]] == [ids[2]]
    # a server started after those stopped (a restart) takes their cursors too
    async with running(database_url) as restarted:
        again = await Client(restarted, first.token).call(
            "GET", "/endpoints", params={"limit": "1", "cursor": cursor}
        )
        assert [e["id"] for e in again.body["items"]] == [ids[1]]
    async with serving_api(elsewhere) as foreign, running(database_url) as home:
        for _ in range(2):
            await _endpoint(foreign)
        made = await foreign.call("GET", "/endpoints", params={"limit": "1"})
        theirs = made.body["next_cursor"]
        # the same list and row (the ids start alike), signed with another key
        assert theirs.partition(".")[0] == cursor.partition(".")[0] and theirs != cursor
        assert (await foreign.call("GET", "/endpoints", params={"cursor": theirs})).status == 200
        for client, given in ((Client(home, first.token), theirs), (foreign, cursor)):
            answer = await client.call("GET", "/endpoints", params={"limit": "1", "cursor": given})
            assert answer.status == 400, answer.body
            assert answer.problem["field"] == "query.cursor"
            assert "another database" in answer.problem["detail"]


async def test_messages_are_searched_and_shown_with_attempts_but_no_header_value(
    db: Db, database_url: str
) -> None:
    kept = db.enqueue("order-1", headers={"X-Api-Key": "k3y-value"})
    dead = db.enqueue("order-2")
    db.kill(dead, attempts=2)
    async with serving_api(database_url) as api:
        by_key = await api.call("GET", "/messages", params={"key": "order-1"})
        assert [m["id"] for m in by_key.body["items"]] == [kept]
        by_state = await api.call("GET", "/messages", params={"state": "dead"})
        assert [m["id"] for m in by_state.body["items"]] == [dead]
        future = await api.call("GET", "/messages", params={"created_from": "2999-01-01T00:00:00Z"})
        assert future.body["items"] == []
        shown = await api.call("GET", f"/messages/{kept}")
        assert shown.body["header_names"] == ["X-Api-Key"]
        assert "k3y-value" not in json.dumps(shown.body)
        attempts = (await api.call("GET", f"/messages/{dead}")).body["attempt_log"]
        assert [a["attempt"] for a in attempts] == [1, 2]
        assert (await api.call("GET", "/messages/999999")).status == 404


async def test_dead_letters_are_listed_retried_and_purged_naming_the_ids_not_dead(
    db: Db, database_url: str
) -> None:
    first, second, waiting = db.enqueue("a"), db.enqueue("b"), db.enqueue("c")
    db.kill(first)
    db.kill(second)
    async with serving_api(database_url) as api:
        listed = await api.call("GET", "/dead")
        assert [m["id"] for m in listed.body["items"]] == [second, first]
        retried = await api.call("POST", "/dead/retry", json_body={"ids": [first, waiting]})
        assert retried.body == {"retried": 1, "missing": [waiting]}
        assert db.row(first)[0] == "ready"
        purged = await api.call("POST", "/dead/purge", json_body={"all": True})
        assert purged.body == {"purged": 1, "missing": []}
        assert _count(db, "messages") == 2
        audit = (await api.call("GET", "/audit")).body["items"]
    assert [(e["action"], e["resource"], e["detail"]["selection"]["all"]) for e in audit] == [
        ("purge", "dead", True),
        ("retry", "dead", False),
    ]


async def test_event_types_and_destination_policies_are_set_listed_and_dropped(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        put = await api.call("PUT", "/event-types/billing%2Finvoice.paid",
                             json_body={"retry_schedule": [5, 60]})  # fmt: skip
        assert put.status == 200 and put.body["event_type"] == "billing/invoice.paid"
        assert put.body["retry_schedule"] == [5.0, 60.0]
        listed = await api.call("GET", "/event-types")
        # beside the outbox's own: its alerts' schedules (migration 0028)
        types = [t["event_type"] for t in listed.body["items"]]
        assert [t for t in types if not t.startswith("outbox.")] == ["billing/invoice.paid"]
        assert (await api.call("DELETE", "/event-types/billing%2Finvoice.paid")).status == 200
        assert (await api.call("GET", "/event-types/billing%2Finvoice.paid")).status == 404

        policy = await api.call(
            "PUT",
            "/destinations",
            json_body={"destination": "https://API.example.com/v1/x", "max_concurrency": 3},
        )
        assert policy.body["destination"] == "https://api.example.com:443"
        listed = await api.call("GET", "/destinations")
        assert [p["max_concurrency"] for p in listed.body["items"]] == [3]
        dropped = await api.call(
            "DELETE", "/destinations", params={"destination": "https://api.example.com"}
        )
        assert dropped.body == {"destination": "https://api.example.com:443"}
        again = await api.call(
            "DELETE", "/destinations", params={"destination": "https://api.example.com"}
        )
        assert again.status == 404
        status = await api.call("GET", "/status")
        assert status.status == 200 and status.body["messages"]["ready"] == 0


async def test_read_only_serves_no_change_and_documents_none(db: Db, database_url: str) -> None:
    async with serving_api(database_url, read_only=True) as api:
        answer = await api.call("POST", "/endpoints", json_body={"url": "https://x.example/"})
        assert answer.status == 405 and answer.problem["status"] == 405
        document = (await api.call("GET", "/openapi.json")).body
        assert {m for ops in document["paths"].values() for m in ops} == {"get"}
        assert (await api.call("GET", "/endpoints")).status == 200
    assert _count(db, "endpoints") == 0


def test_api_tokens_create_prints_the_token_alone_once_and_list_never_shows_it(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", database_url]
    assert main(["api-tokens", "create", "--scope", "read", "--name", "ci", *url]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert out == token + "\n" and token.startswith("obx_") and "created token" in err
    assert main(["api-tokens", "list", "--json", *url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["scope"], t["shown_prefix"]) for t in listed] == [
        ("ci", "read", token[:8])
    ]
    with psycopg.connect(database_url) as conn:
        stored = conn.execute("SELECT to_jsonb(t)::text FROM outbox.api_tokens t").fetchall()
    assert token not in str(stored)
    assert main(["api-tokens", "create", "--scope", "write", "--tenant", "nobody", *url]) == 2
    assert "--tenant" in capsys.readouterr().err
    assert main(["api-tokens", "revoke", "999", *url]) == 1
    assert "no token with id 999" in capsys.readouterr().err


@pytest.mark.slow
def test_outbox_ui_api_only_serves_the_api_and_no_page(database_url: str, tmp_path: Path) -> None:
    token = make_token(database_url, "read")
    argv = ["ui", "--api-only", "--port", "0", "--database-url", database_url]
    with serving(argv, tmp_path / "log") as url:
        request = urllib.request.Request(
            url + "api/v1/status", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["messages"]["dead"] == 0
        with pytest.raises(urllib.error.HTTPError) as page:
            urllib.request.urlopen(url, timeout=10)
        page.value.close()  # an error answer holds its connection until closed
        assert page.value.code == 404


def _get(url: str, token: str, path: str, **params: str) -> tuple[int, dict[str, Any]]:
    """GET ``path`` of the API served at ``url`` (a running ``outbox ui``)."""
    request = urllib.request.Request(
        f"{url}api/v1{path}?{urllib.parse.urlencode(params)}",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as refused:
        with refused:  # an error answer holds its connection until closed
            return refused.code, json.load(refused)


@pytest.mark.slow
def test_a_cursor_of_one_outbox_ui_process_is_taken_by_another_and_after_a_restart(
    db: Db,
    database_url: str,
    pg_server: PgServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = [db.endpoint(f"https://example.com/{n}") for n in range(3)]
    token = make_token(database_url, "read")
    with made_roles(pg_server, database_url) as roles:
        grant_all(database_url, roles, capsys)  # as deployed: the operator's role
        url = roles.urls["operator"]
        argv = ["ui", "--api-only", "--port", "0", "--database-url", url]
        with serving(argv, tmp_path / "a.log") as a, serving(argv, tmp_path / "b.log") as b:
            status, first = _get(a, token, "/endpoints", limit="1")
            assert status == 200 and [e["id"] for e in first["items"]] == ids[:1]
            cursor = first["next_cursor"]
            status, second = _get(b, token, "/endpoints", limit="1", cursor=cursor)
            assert status == 200, second
            assert [e["id"] for e in second["items"]] == ids[1:2]
        with serving(argv, tmp_path / "c.log") as restarted:
            status, again = _get(restarted, token, "/endpoints", cursor=cursor)
            assert status == 200, again
            assert [e["id"] for e in again["items"]] == ids[1:]


async def test_tenants_are_managed_by_external_id_and_own_the_endpoints_made_under_them(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        created = await api.call(
            "POST",
            "/tenants",
            json_body={"external_id": "customer-17", "name": "Acme", "rate_limit": 5},
        )
        assert created.status == 201
        assert (created.body["external_id"], created.body["rate_limit_per_s"]) == ("customer-17", 5)
        taken = await api.call("POST", "/tenants", json_body={"external_id": "customer-17"})
        assert taken.status == 400 and taken.problem["field"] == "body.external_id"
        own = await _endpoint(api, tenant="customer-17")
        assert own["tenant"] == "customer-17" and own["rate_limit_per_s"] == 5  # its default
        operators = await _endpoint(api)
        unknown = await api.call(
            "POST", "/endpoints", json_body={"url": "https://x.example/", "tenant": "nobody"}
        )
        assert unknown.status == 400 and unknown.problem["field"] == "body.tenant"

        async def listed(params: dict[str, str]) -> list[int]:
            body = (await api.call("GET", "/endpoints", params=params)).body
            return [e["id"] for e in body["items"]]

        assert await listed({"tenant": "customer-17"}) == [own["id"]]
        assert await listed({"tenant": "nobody"}) == []
        assert await listed({}) == [own["id"], operators["id"]]

        cleared = await api.call("PATCH", "/tenants/customer-17", json_body={"rate_limit": None})
        assert cleared.body["rate_limit_per_s"] is None and cleared.body["name"] == "Acme"
        make_token(database_url, "read", tenant="customer-17")
        page = await api.call("GET", "/tenants", params={"limit": "1"})
        assert [t["external_id"] for t in page.body["items"]] == ["customer-17"]
        deleted = await api.call("DELETE", "/tenants/customer-17")
        assert deleted.body == {"external_id": "customer-17", "endpoints": 1, "messages": 0}
        assert (await api.call("GET", "/tenants/customer-17")).status == 404
        assert await listed({}) == [operators["id"]]
    assert db.query("SELECT count(*) FROM outbox.api_tokens WHERE tenant_id IS NOT NULL") == [(0,)]


async def test_portal_links_are_made_and_revoked_for_a_tenant_and_audited_without_the_token(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        await api.call("POST", "/tenants", json_body={"external_id": "customer-17"})
        made = await api.call(
            "POST", "/tenants/customer-17/portal-links", json_body={"expires_in_s": 3600}
        )
        assert made.status == 201, made.body
        token = made.body["token"]
        assert made.body["url_path"] == f"/portal/{token}/"
        assert made.body["tenant"] == "customer-17"
        with psycopg.connect(database_url) as conn:
            holder = find_link(conn, token)
        assert holder is not None and holder.tenant == "customer-17"
        left = holder.expires_at - datetime.now(UTC)
        assert timedelta(minutes=58) < left <= timedelta(hours=1)
        default = await api.call("POST", "/tenants/customer-17/portal-links")
        assert default.status == 201  # no body: the default lifetime
        for bad in (59, 31 * 86400, "1h"):
            refused = await api.call(
                "POST", "/tenants/customer-17/portal-links", json_body={"expires_in_s": bad}
            )
            assert refused.status == 400 and refused.problem["field"] == "body.expires_in_s"
        unknown = await api.call("POST", "/tenants/nobody/portal-links")
        assert unknown.status == 404

        revoked = await api.call("DELETE", "/tenants/customer-17/portal-links")
        assert revoked.body == {"tenant": "customer-17", "revoked": 2}
        with psycopg.connect(database_url) as conn:
            assert find_link(conn, token) is None
        again = await api.call("DELETE", "/tenants/customer-17/portal-links")
        assert again.body["revoked"] == 0
    audited = db.query(
        "SELECT action, resource, CAST(detail AS text) FROM outbox.audit_log"
        " WHERE resource = 'portal_link' ORDER BY id"
    )
    assert [row[:2] for row in audited] == [("create", "portal_link")] * 2 + [
        ("revoke", "portal_link")
    ] * 2
    assert all(token not in row[2] for row in audited)
    assert db.query("SELECT count(*) FROM outbox.portal_links") == [(2,)]


async def test_retention_rules_are_set_listed_and_dropped_naming_the_field_at_fault(
    db: Db, database_url: str
) -> None:
    async with serving_api(database_url) as api:
        endpoint = (await _endpoint(api))["id"]
        rules = "/retention-rules"
        made = await api.call(
            "PUT", rules, json_body={"endpoint_id": endpoint, "payload_retention_s": 86400}
        )
        assert made.status == 200, made.body
        assert (made.body["endpoint_id"], made.body["payload_retention_s"]) == (endpoint, 86400.0)
        changed = await api.call(
            "PUT", rules, json_body={"endpoint_id": endpoint, "payload_retention_s": 3600}
        )
        assert changed.body["id"] == made.body["id"] and changed.body["payload_retention_s"] == 3600
        typed = await api.call(
            "PUT", rules, json_body={"event_type": "user.deleted", "payload_retention_s": 60}
        )
        assert typed.status == 200
        refusals = [
            ({"endpoint_id": endpoint, "payload_retention_s": 59}, "body.payload_retention_s"),
            ({"payload_retention_s": 3600}, "body.endpoint_id"),
            ({"endpoint_id": endpoint, "event_type": "a.b", "payload_retention_s": 3600},
             "body.endpoint_id"),
            ({"endpoint_id": endpoint + 1000, "payload_retention_s": 3600}, "body.endpoint_id"),
            ({"event_type": "user.*", "payload_retention_s": 3600}, "body.event_type"),
        ]  # fmt: skip
        for body, field in refusals:
            refused = await api.call("PUT", "/retention-rules", json_body=body)
            assert refused.status == 400 and refused.problem["field"] == field, (body, refused.body)
        listed = await api.call("GET", "/retention-rules")
        assert [(r["endpoint_id"], r["event_type"]) for r in listed.body["items"]] == [
            (endpoint, None),
            (None, "user.deleted"),
        ]
        dropped = await api.call("DELETE", rules, params={"event_type": "user.deleted"})
        assert dropped.body == {"endpoint_id": None, "event_type": "user.deleted"}
        gone = await api.call("DELETE", "/retention-rules", params={"event_type": "user.deleted"})
        assert gone.status == 404
        neither = await api.call("DELETE", "/retention-rules")
        assert neither.status == 400 and neither.problem["field"] == "query.endpoint_id"
    audited = db.query(
        "SELECT action, resource_id FROM outbox.audit_log WHERE resource = 'retention_rule'"
        " ORDER BY id"
    )
    assert audited == [
        ("set", f"endpoint:{endpoint}"),
        ("set", f"endpoint:{endpoint}"),
        ("set", "event_type:user.deleted"),
        ("delete", "event_type:user.deleted"),
    ]


def test_api_only_takes_no_sign_in_token_and_may_bind_beyond_loopback_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    nowhere = ["--database-url", "postgresql://nowhere.invalid/x"]
    assert main(["ui", "--api-only", "--token-file", str(token), *nowhere]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "--api-only" in err and "Traceback" not in err
    monkeypatch.delenv("OUTBOX_UI_TOKEN", raising=False)
    assert main(["ui", "--host", "0.0.0.0", *nowhere]) == 2  # the pages need a token
    assert "without a token" in capsys.readouterr().err
    # the API alone gets past the address check, to the database it cannot reach
    assert main(["ui", "--api-only", "--host", "0.0.0.0", *nowhere]) == 1
    assert "without a token" not in capsys.readouterr().err


async def test_read_only_answers_every_change_405_naming_the_methods_its_path_serves(
    db: Db, database_url: str
) -> None:
    reader = make_token(database_url, "read")
    values = {"{id}": "1", "{event_type}": "a", "{external_id}": "acme"}
    async with serving_api(database_url, read_only=True) as api:
        for route in ROUTES:
            if not route.writes:
                continue
            path = route.path
            for name, value in values.items():
                path = path.replace(name, value)
            served = sorted(r.method for r in ROUTES if r.path == route.path and not r.writes)
            for token in (api.token, reader):
                answer = await api.call(route.method, path, json_body={}, token=token)
                assert answer.status == 405, (route.method, path, answer.body)
                assert answer.problem["type"] == "urn:outbox:problem:method-not-allowed"
                assert answer.headers["Allow"] == ", ".join(served), (route.method, path)
    assert _count(db, "audit_log") == 0
