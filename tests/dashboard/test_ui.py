"""The operator dashboard against a real database, over real HTTP on 127.0.0.1:
every page and action, the guard (session, token, CSRF, Host), the headers, and
escaping of every value a tenant controls."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import trustme
from markupsafe import escape

from dispatchers.bench.env import bench_queries
from dispatchers.cli import main
from dispatchers.store.statements import web_queries
from dispatchers.store.web.activity import Minute
from dispatchers.ui.auth import token_id
from dispatchers.ui.store import READ_ONLY
from outbox._endpoint_tls import pem_digest
from outbox._queries import queries_for
from outbox.destinations import Destinations
from outbox.endpoints import Endpoints
from outbox.retention_rules import RetentionRules
from outbox.secrets import fingerprint
from tests.dashboard import HOSTILE, running
from tests.database import Db
from tests.dispatching import Db as DispatchDb
from tests.dispatching import drain, fast_config
from tests.plans import backlog, index_names, reads_by, today_partitions, whole_reads
from tests.receiver import Receiver

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def _state(db: Db, message_id: int) -> str:
    ((state,),) = db.query("SELECT state FROM outbox.messages WHERE id = %s", message_id)
    return str(state)


async def test_overview_counts_the_backlog_and_every_page_sends_the_security_headers(
    db: Db,
) -> None:
    db.enqueue("a")
    db.enqueue("b")
    db.kill(db.enqueue("c"), attempts=2)
    async with running(db.url) as ui:
        async with ui.http.get(ui.url + "/") as response:
            page = await response.text()
            headers = response.headers
        assert response.status == 200
        assert re.search(r'data-state="ready">2<', page)
        assert re.search(r'data-state="dead">1<', page)
        assert page.count("<svg") == 2  # the last hour by minute, the last day by hour
        assert page.count('<rect class="failed"') == 2  # this minute's, this hour's failures
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert headers["X-Content-Type-Options"] == "nosniff"
        # every script is a file of ours: none inline
        assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/refresh.js" defer>']
        for path in ("/messages", "/dead", "/endpoints", "/static/ui.css", "/static/refresh.js"):
            async with ui.http.get(ui.url + path) as response:
                assert response.status == 200, path
                assert response.headers["Content-Security-Policy"] == csp


async def test_a_local_session_cookie_is_httponly_and_same_site_strict(db: Db) -> None:
    async with running(db.url) as ui:
        async with ui.http.get(ui.url + "/") as response:
            cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


async def test_hostile_values_render_as_text_on_every_page(db: Db) -> None:
    endpoint = db.endpoint(event_types=[HOSTILE], description=HOSTILE)
    (published,) = db.publish(HOSTILE, "event-1")
    db.kill(published)
    with db.tx() as conn:
        Endpoints().disable(conn, endpoint, reason=HOSTILE)
    message = db.enqueue(
        HOSTILE, url="https://example.com/x?q=" + HOSTILE, headers={"X-Note": HOSTILE}
    )
    db.kill(message, error=HOSTILE)
    async with running(db.url) as ui:
        csrf = await ui.csrf(f"/messages/{message}")
        pages = [
            await ui.get("/"),
            await ui.get("/dead"),
            await ui.get("/endpoints"),
            await ui.get(f"/endpoints/{endpoint}"),
            await ui.get("/messages", params={"key": HOSTILE}),
            await ui.get("/messages", params={"event_type": HOSTILE}),
            await ui.get(f"/messages/{message}"),
            await ui.post(f"/messages/{message}/reveal", {"csrf": csrf}),
            await ui.get("/dead/confirm", params={"action": "purge", "event_type": HOSTILE}),
        ]
    for status, page in pages:
        assert status == 200
        assert "<script>alert" not in page and "<img/src" not in page
    escaped = str(escape(HOSTILE))  # as the templates escape it
    assert all(escaped in page for _, page in pages)  # shown, as text


async def test_the_overview_lists_held_and_open_destinations_and_policies(db: Db) -> None:
    empty = "No destination is held by a Retry-After or behind an open circuit breaker."
    async with running(db.url) as ui:
        _, before = await ui.get("/")
        db.query(
            "INSERT INTO outbox.destination_health"
            " (destination, state, blocked_until, failed_probes, opened_at, reason)"
            " VALUES ('https://held.example:443', 'held', now() + interval '1 minute', 0,"
            "         NULL, %s),"
            "        ('https://down.example:443', 'open', now() + interval '1 minute', 3,"
            "         now(), 'HTTP 503') RETURNING 1",
            HOSTILE,
        )
        with db.tx() as conn:
            Destinations().set(conn, "https://slow.example", rate_limit=2.5, burst=5)
        _, page = await ui.get("/")
    assert empty in before and "Destinations with a policy" not in before
    assert empty not in page
    assert '<td data-health="https://held.example:443"><span class="bad">held</span>' in page
    assert '<td data-health="https://down.example:443"><span class="bad">open</span>' in page
    assert "HTTP 503" in page
    assert "<script>alert" not in page and str(escape(HOSTILE)) in page
    assert re.search(r"https://slow.example:443</span></td>\s*<td class=\"num\">2.5</td>", page)


async def test_an_endpoints_page_shows_its_payload_filter_as_text(db: Db) -> None:
    payload_filter = f"key != '{HOSTILE}' && amount > `10`"
    endpoint = db.endpoint(filter=payload_filter)
    async with running(db.url) as ui:
        status, page = await ui.get(f"/endpoints/{endpoint}")
    assert status == 200
    assert "<script>alert" not in page
    assert f'<code id="filter">{escape(payload_filter)}</code>' in page


async def test_an_endpoints_page_shows_its_policy_tls_digests_and_health(db: Db) -> None:
    pem = trustme.CA().cert_pem.bytes().decode()
    endpoint = db.endpoint(rate_limit=2.5, burst=5, retry_schedule=[5, 60, 5400], ca_bundle=pem)
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, reason)"
        " VALUES (%s, 'held', now() + interval '1 minute', %s) RETURNING 1",
        f"endpoint:{endpoint}",
        HOSTILE,
    )
    async with running(db.url) as ui:
        status, page = await ui.get(f"/endpoints/{endpoint}")
    assert status == 200
    assert '<dd id="rate">2.5/s, burst 5</dd>' in page
    assert '<code id="schedule">5s,1m,90m</code>' in page
    assert f"sha256 {pem_digest(pem)}" in page
    assert "BEGIN CERTIFICATE" not in page and pem.splitlines()[1] not in page
    assert '<dd id="health"><span class="bad">held</span> until' in page
    assert "<script>alert" not in page and str(escape(HOSTILE)) in page


async def test_a_message_is_found_by_id_key_and_state_and_shows_its_attempts(db: Db) -> None:
    dead = db.enqueue("order-42")
    db.kill(dead, attempts=3)
    db.enqueue("order-43")
    async with running(db.url) as ui:
        async with ui.http.get(
            ui.url + "/messages", params={"id": str(dead)}, allow_redirects=False
        ) as response:
            assert response.status == 303
            assert response.headers["Location"] == f"/messages/{dead}"
        _, by_key = await ui.get("/messages", params={"key": "order-42"})
        _, by_state = await ui.get("/messages", params={"state": "ready"})
        _, page = await ui.get(f"/messages/{dead}")
        bad, refusal = await ui.get("/messages", params={"state": "lost"})
    assert f'href="/messages/{dead}"' in by_key and "order-43" not in by_key
    assert "order-43" in by_state and "order-42" not in by_state
    assert page.count('<li class="') == 3  # one per attempt, in the timeline
    assert "http_500" in page and "test:1:x" in page
    assert "hidden" in page and "order-42" in page  # header values hidden until revealed
    assert bad == 400 and "state: must be one of" in refusal


async def test_a_message_is_found_by_webhook_id_and_by_creation_time(db: Db) -> None:
    endpoint = db.endpoint(event_types=["order.created"])
    (published,) = db.publish("order.created", "evt-7")
    old = db.enqueue("old-one")
    db.query("UPDATE outbox.messages SET created_at = '2024-01-01T12:00Z' WHERE id = %s", old)
    async with running(db.url) as ui:
        _, by_webhook_id = await ui.get("/messages", params={"webhook_id": f"evt-7:{endpoint}"})
        _, elsewhere = await ui.get("/messages", params={"webhook_id": f"evt-7:{endpoint + 1}"})
        bad, refusal = await ui.get("/messages", params={"webhook_id": "evt-7"})
        window = {"from": "2024-01-01T11:00", "until": "2024-01-01T13:00"}
        _, in_window = await ui.get("/messages", params=window)
        _, since = await ui.get("/messages", params={"from": "2025-01-01T00:00+00:00"})
        wrong, _ = await ui.get("/messages", params={"until": "yesterday"})
    assert f'href="/messages/{published}"' in by_webhook_id
    assert f'href="/messages/{published}"' not in elsewhere and "No message matches" in elsewhere
    assert bad == 400 and "does not end in :&lt;endpoint id&gt;" in refusal
    assert f'href="/messages/{old}"' in in_window
    assert f'href="/messages/{published}"' not in in_window
    assert f'href="/messages/{published}"' in since and f'href="/messages/{old}"' not in since
    assert wrong == 400


async def test_retry_without_the_csrf_token_is_refused_and_changes_nothing(db: Db) -> None:
    message = db.enqueue("k")
    db.kill(message)
    async with running(db.url) as ui:
        csrf = await ui.csrf(f"/messages/{message}")  # a session, as a browser would have
        status, _ = await ui.post(f"/messages/{message}/retry", {})
        assert status == 403
        status, _ = await ui.post(f"/messages/{message}/retry", {"csrf": "0" * 64})
        assert status == 403
        assert _state(db, message) == "dead"
        assert ui.events("ui_action") == []

        status, location = await ui.post_location(f"/messages/{message}/retry", {"csrf": csrf})
        assert status == 303 and location == f"/messages/{message}?done=retry&count=1"
        assert _state(db, message) == "ready"
        _, page = await ui.get(location)
        assert "Sent again: it is ready for the next claim." in page
        # the same address once the message is no longer dead says nothing was done
        status, location = await ui.post_location(f"/messages/{message}/retry", {"csrf": csrf})
        _, again = await ui.get(location)
        assert "It was not dead: nothing retried." in again
        _, forged = await ui.get(f"/messages/{message}?done=retry&count=<b>")
        assert 'id="notice"' not in forged
        event, _ = ui.events("ui_action")
    assert event | {"ts": None} == {
        "ts": None,
        "level": "info",
        "event": "ui_action",
        "who": "local",
        "action": "retry",
        "rows": 1,
        "message_id": message,
    }


async def test_a_post_without_a_session_is_refused(db: Db) -> None:
    message = db.enqueue("k")
    db.kill(message)
    async with running(db.url) as ui:
        csrf = await ui.csrf(f"/messages/{message}")
        ui.http.cookie_jar.clear()
        status, _ = await ui.post(f"/messages/{message}/retry", {"csrf": csrf})
    assert status == 403
    assert _state(db, message) == "dead"


async def test_bulk_retry_and_purge_confirm_how_many_then_act_on_the_filter(db: Db) -> None:
    late = [db.enqueue(f"late-{i}") for i in range(3)]
    early = db.enqueue("early")
    for message in late:
        db.kill(message, attempts=1)
    db.kill(early, attempts=1, died=timedelta(days=2))
    async with running(db.url) as ui:
        _, confirm = await ui.get("/dead/confirm", params={"action": "purge", "since": "1h"})
        assert re.search(r'<b id="count">3</b>', confirm)
        fields = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirm))
        assert set(fields) == {"csrf", "since"}
        status, _ = await ui.post("/dead/purge", {k: html.unescape(v) for k, v in fields.items()})
        assert status == 303
        assert db.query("SELECT id FROM outbox.messages") == [(early,)]
        _, notice = await ui.get("/dead?done=purge&count=3")
        assert "Purged 3 dead message(s)." in notice
        _, kept = await ui.get("/dead", params={"since": fields["since"]})
        assert f"selected>since {fields['since']}<" in kept  # the filter in force is shown

        _, everything = await ui.get("/dead/confirm", params={"action": "retry"})
        assert re.search(r'<b id="count">1</b>', everything) and "every dead message" in everything
        status, _ = await ui.post(
            "/dead/retry", {"csrf": await ui.csrf("/dead/confirm?action=retry")}
        )
        assert status == 303
        assert _state(db, early) == "ready"
        actions = [(e["action"], e["rows"]) for e in ui.events("ui_action")]
    assert actions == [("dead_purge", 3), ("dead_retry", 1)]


async def test_read_only_offers_and_accepts_no_action(db: Db) -> None:
    message = db.enqueue("k")
    db.kill(message)
    endpoint = db.endpoint()
    async with running(db.url, read_only=True) as ui:
        paths = ("/", f"/messages/{message}", "/dead", "/endpoints", f"/endpoints/{endpoint}")
        pages = [await ui.get(p) for p in paths]
        for _, page in pages:
            assert '<form method="post"' not in page and "csrf" not in page
            assert "read-only" in page
        assert "/dead/confirm" not in pages[2][1]
        for path in (
            f"/messages/{message}/retry",
            f"/messages/{message}/reveal",
            "/dead/purge",
            f"/endpoints/{endpoint}/disable",
            f"/endpoints/{endpoint}/edit",
            f"/endpoints/{endpoint}/rotate-secret",
            f"/endpoints/{endpoint}/replay",
            f"/endpoints/{endpoint}/test",
            f"/endpoints/{endpoint}/delete",
            "/endpoints/new",
            f"/messages/{message}/replay",
            f"/messages/{message}/cancel",
        ):
            status, _ = await ui.post(path, {})
            assert status in (403, 405), path
        status, _ = await ui.get("/dead/confirm?action=purge")
        confirmations = [
            (await ui.get(p))[0]
            for p in (f"/endpoints/{endpoint}/rotate-secret", f"/endpoints/{endpoint}/delete")
        ]
        new_status, new_page = await ui.get("/endpoints/new")
    assert status == 404 and confirmations == [404, 404]
    assert new_status == 400 and 'name="url"' not in new_page
    assert _state(db, message) == "dead"
    assert db.query("SELECT count(*) FROM outbox.messages") == [(1,)]
    assert db.query("SELECT count(*) FROM outbox.endpoint_secrets") == [(1,)]


async def test_with_a_token_every_page_asks_to_sign_in_first(db: Db) -> None:
    async with running(db.url, token="s3cret-token") as ui:
        async with ui.http.get(ui.url + "/dead", allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == "/login"
        status, page = await ui.post("/login", {"token": "wrong"})
        assert status == 403 and "not the token" in page
        async with ui.http.post(
            ui.url + "/login", data={"token": "s3cret-token"}, allow_redirects=False
        ) as response:
            assert response.status == 303
            cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert "s3cret-token" not in cookie
        status, _ = await ui.get("/dead")
        assert status == 200
        message = db.enqueue("k")
        db.kill(message)
        csrf = await ui.csrf(f"/messages/{message}")
        status, _ = await ui.post(f"/messages/{message}/retry", {"csrf": csrf})
        assert status == 303
        (event,) = ui.events("ui_action")
    assert event["who"] == token_id("s3cret-token") != "local"


async def test_without_a_token_only_loopback_host_names_are_served(db: Db) -> None:
    async with running(db.url) as ui:
        status, _ = await ui.get("/", headers={"Host": "attacker.example:8321"})
        assert status == 421
        status, _ = await ui.get("/", headers={"Host": "localhost:8321"})
        assert status == 200


def test_the_command_refuses_a_non_loopback_address_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_UI_TOKEN", raising=False)
    code = main(["ui", "--host", "0.0.0.0", "--database-url", "postgresql://nowhere/x"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "without a token" in err


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("\n", "holds no token")])
@pytest.mark.slow
def test_the_command_refuses_a_token_file_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    code = main(["ui", "--token-file", str(path), "--database-url", "postgresql://nowhere/x"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def _plan(
    db: Db, name: str, *, library: bool = False, read_whole: Collection[str] = (), **params: object
) -> str:
    # as a page runs it: in the dashboard's transaction, planned for its values
    text = (queries_for("outbox") if library else web_queries("outbox"))[name].text

    def explain(*settings: str) -> str:
        with db.tx() as conn:
            conn.execute(READ_ONLY)
            for setting in settings:
                conn.execute(setting)
            rows = conn.execute("EXPLAIN (ANALYZE) " + text, params).fetchall()
        return "\n".join(str(r[0]) for r in rows)

    def whole(plan: str) -> set[str]:
        found: set[str] = set()
        for table in ("delivered", "attempts"):
            found |= set(whole_reads(db.url, plan, table)) - set(read_whole)
        return found

    plan = explain()
    assert "JIT:" not in plan, plan
    # no part of the history that holds rows is read whole (the partitions made
    # ahead are empty, and reading one of them whole costs nothing), but those
    # whose every row the statement asked for: then that is the cheapest way.
    # Today's partition holds only the hours since midnight UTC, and under a
    # window of the last hour the planner may find a share of them cheaper to
    # read whole: what is judged then is the plan it takes with sequential scans
    # priced out, which reads each part through an index if one serves.
    if whole(plan) and whole(plan) <= today_partitions(db.url):
        plan = explain("SET LOCAL enable_seqscan = off", "SET LOCAL jit = off")
    assert not whole(plan), (name, whole(plan), plan)
    return plan


def _within(db: Db, since: datetime, until: datetime) -> set[str]:
    """The partitions of attempts whose every row started between since and until."""
    rows = db.query(
        "SELECT CAST(tableoid AS regclass) FROM outbox.attempts GROUP BY tableoid"
        " HAVING min(started_at) >= %s AND max(started_at) < %s",
        since,
        until,
    )
    return {str(part).removeprefix("outbox.") for (part,) in rows}


@pytest.mark.every_server
@pytest.mark.slow
def test_the_dashboards_statements_read_bounded_windows_through_indexes(db: Db) -> None:
    # on tables as a busy outbox has them, with their statistics: a month of
    # history, a backlog, some of it running
    with psycopg.connect(db.url) as conn:
        seed = bench_queries("outbox")["seed_history"]
        conn.execute(seed, {"target": "https://example.com", "rows": 20_000, "body": b""})
        for table, column, columns in (
            ("attempts", "message_id", ("started_at",)),
            ("delivered", "id", ("created_at", "completed_at")),
        ):
            shift = ", ".join(f"{c} = {c} - ({column} % 30) * interval '1 day'" for c in columns)
            conn.execute(f"UPDATE outbox.{table} SET {shift}")
    backlog(db.url, running=False)
    db.query(
        "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'o',"
        " lease_until = now() + interval '1 minute' WHERE id %% 10 = 0"
    )
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until)"
        " SELECT 'https://h' || g || '.example:443', 'held', now() - interval '1 hour'"
        " FROM generate_series(1, 2000) AS g"
    )
    # 2,000 tenants of two endpoints each, and 20 endpoints of no tenant; half of
    # the queue and of the history is theirs, a third of the queue dead
    db.query(
        "INSERT INTO outbox.tenants (external_id)"
        " SELECT 'customer-' || g FROM generate_series(1, 2000) AS g"
    )
    db.query(
        "INSERT INTO outbox.endpoints (url, tenant_id)"
        " SELECT 'https://t' || t.id || '-' || g || '.example/hook', t.id"
        " FROM outbox.tenants AS t, generate_series(1, 2) AS g"
    )
    db.query(
        "INSERT INTO outbox.endpoints (url)"
        " SELECT 'https://own' || g || '.example/hook' FROM generate_series(1, 20) AS g"
    )
    for table, destination in (
        ("messages", ", destination = 'endpoint:' || e.id"),
        ("delivered", ""),
    ):
        db.query(
            f"UPDATE outbox.{table} AS x"
            f" SET endpoint_id = e.id, target = 'endpoint:' || e.id, url = NULL{destination}"
            " FROM (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n"
            "       FROM outbox.endpoints) AS e"
            " WHERE x.id %% 2 = 0 AND e.n = (x.id / 2) %% 4020"
        )
    db.query(
        "UPDATE outbox.messages SET state = 'dead',"
        " completed_at = now() - (id %% 100) * interval '1 minute'"
        " WHERE id %% 3 = 0 AND state = 'ready'"
    )
    db.query("ANALYZE")
    assert reads_by(db.url, _plan(db, "web_minutes"), "attempts_started_idx")
    owners = _plan(db, "web_dispatchers")
    assert reads_by(db.url, owners, "attempts_started_idx") and "messages_lease_idx" in owners
    assert "destination_health_pkey" in _plan(db, "web_destination_health", destination="x")
    search: dict[str, object] = dict.fromkeys(
        ("key", "event_type", "endpoint_id", "state", "created_from", "created_until", "body")
    ) | {"before": None, "after": None, "scan": 100, "tenant_id": None, "untenanted": False}
    (customer_7,) = db.query("SELECT id FROM outbox.tenants WHERE external_id = 'customer-7'")[0]
    newest = _plan(db, "web_messages", **search, limit=100)
    for name, cursor in (("web_messages", "before"), ("web_messages_newer", "after")):
        paged = _plan(db, name, **(search | {cursor: 5000}), limit=100)
        assert "messages_pkey" in paged and reads_by(db.url, paged, "delivered_pkey"), name
    bodies = _plan(db, "web_messages", **(search | {"body": b"x", "scan": 5000}), limit=100)
    assert "messages_pkey" in bodies and reads_by(db.url, bodies, "delivered_pkey")
    by_key = _plan(db, "web_messages", **(search | {"key": "order-42"}), limit=100)
    assert reads_by(db.url, by_key, "delivered_key_idx")
    assert "messages_pkey" in newest and reads_by(
        db.url, newest, "delivered_pkey"
    )  # newest first, by id
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    window = {"created_from": long_ago, "created_until": long_ago + timedelta(days=1)}
    assert reads_by(
        db.url, _plan(db, "web_messages", **(search | window), limit=100), "delivered_created_idx"
    )
    # a tenant's messages: its endpoints by endpoints_tenant_idx, their messages by
    # the endpoint indexes of the queue and the history, never a whole table
    tenants = _plan(db, "web_messages", **(search | {"tenant_id": customer_7}), limit=100)
    assert "endpoints_tenant_idx" in tenants, tenants
    assert "messages_endpoint_idx" in tenants and reads_by(
        db.url, tenants, "delivered_endpoint_idx"
    ), tenants
    for name, cursor in (("web_messages", "before"), ("web_messages_newer", "after")):
        # a page further on: the cursor's range of each primary key may be cheaper
        paged = _plan(db, name, **(search | {"tenant_id": customer_7, cursor: 30_000}), limit=100)
        assert "endpoints_tenant_idx" in paged, paged
        assert re.search(r"(on|using) messages_(endpoint_idx|pkey)", paged), paged
        assert reads_by(db.url, paged, "delivered_endpoint_idx") or reads_by(
            db.url, paged, "delivered_pkey"
        ), paged
        assert "Seq Scan on messages" not in paged, paged
    # no tenant's: newest first by id, as without the filter
    untenanted = _plan(db, "web_messages", **(search | {"untenanted": True}), limit=100)
    assert "messages_pkey" in untenanted and reads_by(db.url, untenanted, "delivered_pkey"), (
        untenanted
    )
    page = {"after": 0, "attention": False, "enabled": None, "limit": 101}
    for tenant, scope in (("customer-7", (customer_7, False)), ("-", (None, True))):
        tenant_id, untenanted = scope
        listed = _plan(db, "web_endpoint_page", **page, tenant_id=tenant_id, untenanted=untenanted)
        assert "Seq Scan on messages" not in listed, listed
        dead = {"endpoint_id": None, "event_type": None, "since": None, "tenant": tenant}
        plan = _plan(db, "dead_list", library=True, **dead, limit=100)
        assert "Seq Scan on messages" not in plan, plan
    pages = _plan(
        db,
        "web_endpoint_page",
        **(page | {"attention": True}),
        tenant_id=customer_7,
        untenanted=False,
    )
    assert "endpoints_tenant_idx" in pages, pages
    # the operator's list of those needing attention, and a page's backlog: the
    # dead messages of each endpoint of the page by the endpoint index of the queue
    everyone = _plan(
        db, "web_endpoint_page", **(page | {"attention": True}), tenant_id=None, untenanted=False
    )
    assert "endpoints_pkey" in everyone and "Seq Scan on messages" not in everyone, everyone
    backlog_plan = _plan(db, "web_endpoint_backlog", ids=list(range(1, 101)), tenant_id=None)
    assert "messages_endpoint_idx" in backlog_plan and "endpoints_pkey" in backlog_plan, (
        backlog_plan
    )
    dead = {"endpoint_id": None, "event_type": None, "since": None, "tenant": "customer-7"}
    assert "messages_endpoint_idx" in _plan(db, "dead_list", library=True, **dead, limit=100)
    assert "endpoints_pkey" in _plan(db, "web_endpoint_tenants", ids=list(range(1, 101)))
    day = {"since": datetime.now(UTC) - timedelta(hours=23), "until": datetime.now(UTC)}
    # the last 23 hours, which may hold today's partition whole: that one may be read
    # whole, and one that holds rows outside them is read by the index (from 23:00
    # UTC on, the window lies in today's partition alone, and no index is needed)
    within = _within(db, day["since"], day["until"])
    hours = _plan(db, "web_hours", read_whole=within, **day)
    partly = set(re.findall(r" on (attempts_\w+)", hours)) - within
    assert not partly or reads_by(db.url, hours, "attempts_started_idx"), hours
    assert reads_by(db.url, _plan(db, "web_endpoints_hour"), "attempts_started_idx")
    for name in ("web_endpoint_hour", "web_endpoint_attempts"):
        plan = _plan(db, name, endpoint_id=1, limit=20, tenant_id=None)
        assert reads_by(db.url, plan, "attempts_started_idx"), name
        # the history over the window only, never the endpoint's whole past
        history = re.findall(r"using (\w+) on delivered\w* d\w*.*\n(.*)", plan)
        keys = index_names(db.url, "delivered_pkey")
        assert history and all(
            index in keys or "completed_at" in cond for index, cond in history
        ), plan


async def test_endpoints_show_health_and_fingerprints_and_disable_then_enable(db: Db) -> None:
    secret = "whsec_" + "A" * 44
    endpoint = db.endpoint(event_types=["order.created"], secret=secret, description="Acme")
    (message,) = db.publish("order.created", "e1")
    async with running(db.url) as ui:
        _, page = await ui.get("/endpoints")
        assert fingerprint(secret) in page and secret not in page
        assert "Acme" in page and "order.created" in page
        csrf = await ui.csrf("/endpoints")
        status, _ = await ui.post(f"/endpoints/{endpoint}/disable", {"csrf": csrf, "reason": ""})
        assert status == 303
        assert _state(db, message) == "paused"
        _, page = await ui.get("/endpoints")
        assert "disabled from the dashboard" in page
        status, _ = await ui.post(f"/endpoints/{endpoint}/enable", {"csrf": csrf})
        assert status == 303
        assert _state(db, message) == "ready"
        actions = [(e["action"], e["rows"], e["endpoint_id"]) for e in ui.events("ui_action")]
    assert actions == [("endpoint_disable", 1, endpoint), ("endpoint_enable", 1, endpoint)]


async def test_an_endpoints_page_says_how_long_it_keeps_payloads(db: Db) -> None:
    endpoint = db.endpoint()
    other = db.endpoint(url="https://example.com/other")
    async with running(db.url) as ui:
        _, page = await ui.get(f"/endpoints/{endpoint}")
        assert "as long as the history" in _field(page, "retention")
        with db.tx() as conn:
            RetentionRules().set(conn, payload_retention=3 * 86400, endpoint_id=endpoint)
        _, page = await ui.get(f"/endpoints/{endpoint}")
        kept = _field(page, "retention")
        assert "<code>3d</code> after delivery" in kept and "erased up to" not in kept
        db.query(
            "UPDATE outbox.retention_rules SET erased_until = now() - interval '3 days'"
            " WHERE endpoint_id = %s",
            endpoint,
        )
        _, page = await ui.get(f"/endpoints/{endpoint}")
        assert "erased up to" in _field(page, "retention")
        _, page = await ui.get(f"/endpoints/{other}")  # another endpoint's rule is not its own
        assert "as long as the history" in _field(page, "retention")


def _field(page: str, name: str) -> str:
    found = re.search(rf'<dd id="{name}">(.*?)</dd>', page, re.S)
    assert found, page
    return found.group(1)


async def test_pages_read_in_read_only_transactions_bounded_in_time(db: Db) -> None:
    async with running(db.url) as ui:
        store = ui.dashboard.store
        settings = await store.read(
            lambda conn: conn.execute(
                "SELECT current_setting('transaction_read_only'),"
                " current_setting('statement_timeout')"
            ).fetchone()
        )
        written = await store.write(
            lambda conn: conn.execute("SELECT current_setting('transaction_read_only')").fetchone()
        )
    assert settings == ("on", "5s")
    assert written == ("off",)


def _attempt(db: Db, message_id: int, *, status: int, duration_ms: int, ago: str = "0") -> None:
    outcome = "delivered" if status < 300 else "failed"
    db.query(
        "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, duration_ms,"
        " status, outcome) VALUES (%s, 1 + (SELECT count(*) FROM outbox.attempts"
        " WHERE message_id = %s), 'test:2:y', now() - CAST(%s AS interval), %s, %s, %s)",
        message_id,
        message_id,
        ago,
        duration_ms,
        status,
        outcome,
    )


def _delivered(db: Db, endpoint: int, message_id: int) -> None:
    """A message of ``endpoint`` delivered five minutes ago, in the history."""
    db.query(
        "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, method,"
        " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
        " created_at, completed_at) VALUES (%s, %s, %s, %s, 'POST', '{}', '{}',"
        " 'application/json', 'order.created', 1, 8, 200, now() - interval '6 minutes',"
        " now() - interval '5 minutes')",
        message_id,
        f"evt-{message_id}:{endpoint}",
        f"endpoint:{endpoint}",
        endpoint,
    )


async def test_an_endpoints_page_sums_up_its_last_hour_of_attempts(db: Db) -> None:
    endpoint = db.endpoint(event_types=["order.created"], max_concurrency=3)
    other = db.endpoint(event_types=["other.thing"])
    (failing,) = db.publish("order.created", "e1")
    db.kill(failing, attempts=2)  # two 500s of 5 ms
    _delivered(db, endpoint, 9001)
    _attempt(db, 9001, status=200, duration_ms=40)
    _attempt(db, 9001, status=200, duration_ms=900, ago="2 hours")  # out of the window
    (elsewhere,) = db.publish("other.thing", "e2")
    _attempt(db, elsewhere, status=404, duration_ms=7)  # another endpoint's
    async with running(db.url) as ui:
        status, page = await ui.get(f"/endpoints/{endpoint}")
        _, overview = await ui.get("/endpoints")
        missing, _ = await ui.get("/endpoints/999999")
    assert status == 200 and missing == 404
    assert re.search(r'id="attempts">3<', page)
    assert re.search(r'id="success-rate">33.3 %<', page)
    assert re.search(r'id="p50">5 ms<', page) and re.search(r'id="p99">40 ms<', page)
    assert re.search(r'data-status="500">2<', page) and re.search(r'data-status="200">1<', page)
    assert 'data-status="404"' not in page
    assert re.search(r'id="in-flight">0 of 3<', page)
    assert page.count('href="/messages/9001"') == 1  # the recent attempts
    assert page.count(f'href="/messages/{failing}"') == 2
    assert f'href="/endpoints/{endpoint}"' in overview and f'href="/endpoints/{other}"' in overview
    # the list sums up each endpoint's hour as its page does
    row = overview[overview.index(f'id="endpoint-{endpoint}"') :]
    row = row[: row.index("</tr>")]
    assert re.search(r'data-field="success">33.3 %<div class="muted">of 3<', row)
    assert re.search(r'data-field="durations">5 / 40 ms<', row)
    assert re.search(r'data-field="in-flight">0 / 3<', row)
    row = overview[overview.index(f'id="endpoint-{other}"') :]
    row = row[: row.index("</tr>")]
    assert re.search(r'data-field="success">0.0 %<div class="muted">of 1<', row)
    assert re.search(r'data-field="in-flight">0 / -<', row)


async def test_an_endpoint_is_edited_its_secret_rotated_and_its_history_replayed(
    db: Db,
) -> None:
    endpoint = db.endpoint(event_types=["order.created"], max_concurrency=3)
    _delivered(db, endpoint, 9002)
    async with running(db.url) as ui:
        csrf = await ui.csrf(f"/endpoints/{endpoint}")
        status, refusal = await ui.post(f"/endpoints/{endpoint}/edit", {"csrf": csrf, "cap": "0"})
        assert status == 400 and "cap:" in refusal
        form = {"csrf": csrf, "event_types": "order.*, refund.created", "cap": ""}
        status, _ = await ui.post(f"/endpoints/{endpoint}/edit", form)
        assert status == 303

        status, _ = await ui.post(f"/endpoints/{endpoint}/rotate-secret", {})
        assert status == 403  # no CSRF token: nothing rotated
        # one click is not enough: the form without confirm leads to the confirmation
        status, location = await ui.post_location(
            f"/endpoints/{endpoint}/rotate-secret", {"csrf": csrf}
        )
        assert (status, location) == (303, f"/endpoints/{endpoint}/rotate-secret")
        assert db.query("SELECT count(*) FROM outbox.endpoint_secrets") == [(1,)]
        _, confirmation = await ui.get(location)
        fields = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirmation))
        assert fields == {"csrf": csrf, "confirm": "rotate"}
        assert 'id="confirm-rotate"' in confirmation and "keep signing" in confirmation
        status, answer = await ui.post(f"/endpoints/{endpoint}/rotate-secret", fields)
        assert status == 200 and "keep signing for 24 hours" in answer
        assert f"outbox endpoints show {endpoint} --show-secrets" in answer
        assert "not shown again." not in answer
        match = re.search(r'<pre id="secret">(whsec_[A-Za-z0-9+/=]+)</pre>', answer)
        assert match is not None
        secret = match[1]
        _, after = await ui.get(f"/endpoints/{endpoint}")

        status, _ = await ui.post(f"/endpoints/{endpoint}/replay", {"csrf": csrf, "since": "1h"})
        assert status == 303
        _, replayed = await ui.get(f"/endpoints/{endpoint}?done=replay&count=1")
        rotate = {"confirm": "rotate"}
        for action, form in (("replay", {"since": "1h"}), ("rotate-secret", rotate), ("edit", {})):
            status, refusal = await ui.post(f"/endpoints/999999/{action}", {"csrf": csrf, **form})
            assert status == 400 and "no endpoint with id 999999" in refusal, action
        events = ui.events("ui_action")
        log = ui.log.getvalue()
    with db.tx() as conn:
        saved = Endpoints().require(conn, endpoint)
    assert saved.event_types == ["order.*", "refund.created"] and saved.max_concurrency is None
    assert [s.secret for s in saved.secrets if s.expires_at is None] == [secret]
    assert len(saved.secrets) == 2  # the previous one signs during the overlap
    assert secret not in after and fingerprint(secret) in after  # shown once
    assert secret not in log
    assert _state(db, 9002) == "ready"
    assert "Replayed 1 delivered message(s)." in replayed
    actions = [(e["action"], e["rows"]) for e in events]
    assert actions == [("endpoint_edit", 1), ("endpoint_rotate_secret", 1), ("endpoint_replay", 1)]
    assert events[1]["new"] == fingerprint(secret)


async def test_a_delivered_webhook_is_replayed_from_its_page(db: Db) -> None:
    endpoint = db.endpoint()
    _delivered(db, endpoint, 9003)
    plain = db.enqueue("plain-k")
    async with running(db.url) as ui:
        _, page = await ui.get("/messages/9003")
        _, waiting = await ui.get(f"/messages/{plain}")
        csrf = await ui.csrf("/messages/9003")
        status, _ = await ui.post("/messages/9003/replay", {})
        assert status == 403  # no CSRF token: still in the history
        assert db.query("SELECT count(*) FROM outbox.delivered WHERE id = 9003") == [(1,)]
        status, location = await ui.post_location("/messages/9003/replay", {"csrf": csrf})
        _, after = await ui.get(location)
        events = ui.events("ui_action")
    assert 'id="replay"' in page and 'id="replay"' not in waiting
    assert status == 303 and location == "/messages/9003?done=replay&count=1"
    assert '<p class="notice" role="status" id="notice">Replayed:' in after
    assert 'id="notice"' not in page
    assert _state(db, 9003) == "ready" and 'id="replay"' not in after
    assert [(e["action"], e["rows"]) for e in events] == [("replay_message", 1)]


async def test_a_test_event_is_sent_to_the_endpoint_and_its_message_shown(db: Db) -> None:
    endpoint = db.endpoint(event_types=["order.created"])
    async with running(db.url) as ui:
        csrf = await ui.csrf(f"/endpoints/{endpoint}")
        assert 'id="test-event"' in (await ui.get(f"/endpoints/{endpoint}"))[1]
        status, _ = await ui.post(f"/endpoints/{endpoint}/test", {})
        assert status == 403  # no CSRF token: nothing written
        assert db.query("SELECT count(*) FROM outbox.messages") == [(0,)]
        status, location = await ui.post_location(f"/endpoints/{endpoint}/test", {"csrf": csrf})
        status_missing, refusal = await ui.post("/endpoints/999999/test", {"csrf": csrf})
        events = ui.events("ui_action")
    ((message, event_type, kept_endpoint),) = db.query(
        "SELECT id, event_type, endpoint_id FROM outbox.messages"
    )
    assert status == 303 and location == f"/messages/{message}"
    assert (event_type, kept_endpoint) == ("outbox.test", endpoint)  # whatever it subscribes to
    assert status_missing == 400 and "no endpoint with id 999999" in refusal
    assert [(e["action"], e["rows"], e["message_id"]) for e in events] == [
        ("endpoint_test_event", 1, message)
    ]


async def test_sign_in_refuses_an_address_after_a_few_wrong_tokens(db: Db) -> None:
    async with running(db.url, token="s3cret-token") as ui:
        statuses = [(await ui.post("/login", {"token": f"guess-{i}"}))[0] for i in range(6)]
        status, page = await ui.post("/login", {"token": "s3cret-token"})
    assert statuses == [403] * 5 + [429]
    assert status == 429 and "Too many wrong tokens" in page  # even the right one, for now


async def test_the_day_chart_reads_a_settled_hour_once_and_the_others_every_time(
    db: Db,
) -> None:
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    message = db.enqueue("k")
    # two hours ago: settled whenever the test runs; and in the hour in progress
    settled_ago = f"{(now - hour).total_seconds() + 5400} seconds"
    current_ago = f"{(now - hour).total_seconds() / 2} seconds"
    until = hour + timedelta(hours=1)  # the hour in progress is the window's last

    def delivered(rows: list[Minute]) -> int:
        return sum(m.delivered for m in rows)

    _attempt(db, message, status=200, duration_ms=5, ago=settled_ago)
    _attempt(db, message, status=200, duration_ms=5, ago=current_ago)
    async with running(db.url) as ui:  # it has read the day before it answers
        store = ui.dashboard.store

        async def hours() -> int:
            return delivered(await store.read(lambda conn: store.hours(conn, until=until)))

        assert await hours() == 2
        # an hour that is settled is read once: a row written into it later (which
        # no dispatcher does, an attempt is recorded within minutes) is not seen
        _attempt(db, message, status=200, duration_ms=5, ago=settled_ago)
        assert await hours() == 2
        # the hour in progress is read on every call
        _attempt(db, message, status=200, duration_ms=5, ago=current_ago)
        assert await hours() == 3
    # a new dashboard reads the whole day again
    async with running(db.url) as ui:
        store = ui.dashboard.store
        assert delivered(await store.read(lambda conn: store.hours(conn, until=until))) == 4


def _owner_status(page: str, owner: str) -> str:
    match = re.search(rf'<td data-owner="{re.escape(owner)}"><span[^>]*>([^<]+)</span>', page)
    assert match is not None, owner
    return match[1]


async def test_dispatchers_seen_say_whether_each_is_alive_or_stopped(db: Db) -> None:
    live, expired = db.enqueue("held-live"), db.enqueue("held-expired")
    for message, until in ((live, "1 minute"), (expired, "-5 minutes")):
        db.query(
            "UPDATE outbox.messages SET state = 'running', lease_owner = %s,"
            " lease_until = now() + CAST(%s AS interval) WHERE id = %s",
            f"host:{message}:lease",
            until,
            message,
        )
    drained = db.enqueue("drained")
    working = db.enqueue("working")
    for message, owner, ago in (
        (drained, "host:1:drain", "20 minutes"),
        (working, "host:2:w", "5"),
    ):
        db.query(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, duration_ms,"
            " status, outcome) VALUES (%s, 1, %s, now() - CAST(%s AS interval), 40, 200,"
            " 'delivered')",
            message,
            owner,
            ago,
        )
    async with running(db.url) as ui:
        _, page = await ui.get("/")
    assert _owner_status(page, f"host:{live}:lease") == "alive"
    assert _owner_status(page, "host:2:w") == "alive"
    assert _owner_status(page, f"host:{expired}:lease") == "stopped, leases expired"
    assert _owner_status(page, "host:1:drain") == "stopped or idle"
    # the alive first; the drained run with when it was last seen (its attempt's end)
    assert page.index("host:2:w") < page.index("host:1:drain")
    row = page[page.index('data-owner="host:1:drain"') :]
    assert re.match(r'[^\n]*\n\s*<td><time datetime="[^"]+">', row)


def _listed(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td class="num"><a href="/messages/(\d+)">', page)]


def _link(page: str, name: str) -> str | None:
    match = re.search(rf'href="(/messages\?[^"]*)" id="{name}-page"', page)
    return html.unescape(match[1]) if match else None


@pytest.mark.slow
async def test_messages_page_by_id_keeping_the_filters_both_ways(db: Db) -> None:
    ids = [db.enqueue(f"page-{i}") for i in range(230)]
    db.query("UPDATE outbox.messages SET event_type = 'order.created'")
    other = db.enqueue("not-an-order")
    _delivered(db, db.endpoint(), 9100)  # in the history: 'order.created' too, newest id
    async with running(db.url) as ui:
        _, first = await ui.get("/messages", params={"event_type": "order.created"})
        older = _link(first, "older")
        assert older is not None and "event_type=order.created" in older
        _, second = await ui.get(older)
        third_link = _link(second, "older")
        assert third_link is not None
        _, third = await ui.get(third_link)
        newer = _link(third, "newer")
        assert newer is not None
        _, back = await ui.get(newer)
        bad, refusal = await ui.get("/messages?before=3&after=1")
    everything = [9100, *reversed(ids)]
    assert _listed(first) == everything[:100] and _newest_absent(first)
    assert _listed(second) == everything[100:200]
    assert _listed(third) == everything[200:] and _link(third, "older") is None
    assert _listed(back) == _listed(second)  # newer from the third page: the second
    assert other not in _listed(first) + _listed(second) + _listed(third)
    assert bad == 400 and "before:" in refusal


def _newest_absent(page: str) -> bool:
    return 'id="newest-page"' not in page and _link(page, "newer") is None


async def test_messages_are_found_by_text_in_their_bodies_within_a_stated_bound(
    db: Db,
) -> None:
    needle = db.enqueue("k1", json={"customer": "cus_NEEDLE_42"})
    db.enqueue("k2", json={"customer": "cus_other"})
    async with running(db.url) as ui:
        _, found = await ui.get("/messages", params={"body": "NEEDLE_42"})
        _, nothing = await ui.get("/messages", params={"body": "absent-text"})
    assert _listed(found) == [needle]
    assert "newest 5,000 messages" in found and 'id="body-bound"' in found
    assert _listed(nothing) == [] and "No message matches" in nothing


async def test_messages_held_by_a_breaker_are_marked_and_link_their_endpoint(db: Db) -> None:
    endpoint = db.endpoint(event_types=["order.created"])
    (held,) = db.publish("order.created", "e1")
    free = db.enqueue("free")
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
        " VALUES (%s, 'open', now() + interval '1 minute', now()) RETURNING 1",
        f"endpoint:{endpoint}",
    )
    async with running(db.url) as ui:
        _, page = await ui.get("/messages")
    rows = {int(m[0]): m[1] for m in re.findall(r'href="/messages/(\d+)">.*?</tr>()', page, re.S)}
    held_row = page[page.index(f'href="/messages/{held}"') :]
    held_row = held_row[: held_row.index("</tr>")]
    free_row = page[page.index(f'href="/messages/{free}"') :]
    free_row = free_row[: free_row.index("</tr>")]
    assert len(rows) == 2
    assert "held by breaker" in held_row and "held by breaker" not in free_row
    assert f'<a href="/endpoints/{endpoint}">{endpoint}</a>' in held_row


async def test_a_waiting_message_is_cancelled_and_never_sent_but_a_held_one_is_not(
    db: Db, receiver: Receiver
) -> None:
    due = db.enqueue("due", url=receiver.url)
    scheduled = db.enqueue(
        "later", url=receiver.url, available_at=datetime.now(UTC) + timedelta(hours=1)
    )
    held = db.enqueue("held", url=receiver.url)
    sent = db.enqueue("sent", url=receiver.url)
    db.query(
        "UPDATE outbox.messages SET state = 'running', lease_owner = 'host:1:x',"
        " lease_until = now() + interval '1 minute' WHERE id = %s",
        held,
    )
    async with running(db.url) as ui:
        _, page = await ui.get(f"/messages/{due}")
        _, running_page = await ui.get(f"/messages/{held}")
        csrf = await ui.csrf(f"/messages/{due}")
        refused, _ = await ui.post(f"/messages/{due}/cancel", {})
        assert refused == 403 and _state(db, due) == "ready"
        answers = [
            await ui.post_location(f"/messages/{m}/cancel", {"csrf": csrf})
            for m in (due, scheduled, held)
        ]
        _, notice = await ui.get(answers[0][1])
        _, passed_over = await ui.get(answers[2][1])
        events = [(e["action"], e["rows"], e["message_id"]) for e in ui.events("ui_action")]
    assert 'id="cancel"' in page and 'id="cancel"' not in running_page
    assert answers == [
        (303, f"/messages/{due}?done=cancel&count=1"),
        (303, f"/messages/{scheduled}?done=cancel&count=1"),
        (303, f"/messages/{held}?done=cancel&count=0"),
    ]
    assert "Cancelled: it is dead and will not be sent unless retried." in notice
    assert "nothing cancelled" in passed_over
    assert events == [("cancel", 1, due), ("cancel", 1, scheduled), ("cancel", 0, held)]
    assert _state(db, held) == "running"  # the dispatcher holding it decides
    ((error,),) = db.query("SELECT last_error FROM outbox.messages WHERE id = %s", due)
    assert error == "cancelled by an operator"
    # a dispatcher drains the outbox, after the scheduled one's time: only the
    # message never cancelled is sent
    db.query("UPDATE outbox.messages SET available_at = now() RETURNING 1")
    db.query(
        "UPDATE outbox.messages SET state = 'dead', lease_owner = NULL, lease_until = NULL,"
        " completed_at = now() WHERE id = %s RETURNING 1",
        held,
    )
    await drain(DispatchDb(db.url), fast_config())
    assert [json.loads(r.body) for r in receiver.requests] == [{"key": "sent"}]
    assert {_state(db, m) for m in (due, scheduled)} == {"dead"}
    assert sent not in [row[0] for row in db.query("SELECT id FROM outbox.messages")]


async def test_selected_dead_messages_are_retried_or_purged_after_a_confirmation(
    db: Db,
) -> None:
    dead = [db.enqueue(f"dead-{i}") for i in range(4)]
    for message in dead:
        db.kill(message, attempts=1)
    waiting = db.enqueue("waiting")
    async with running(db.url) as ui:
        _, listing = await ui.get("/dead")
        boxes = re.findall(r'<input type="checkbox" name="id" value="(\d+)"', listing)
        selected = [
            ("selected", "1"),
            ("action", "purge"),
            ("id", str(dead[0])),
            ("id", str(dead[2])),
            ("id", str(waiting)),
        ]
        _, confirm = await ui.get("/dead/confirm", params=selected)
        fields = re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirm)
        refused, _ = await ui.post("/dead/purge", {k: v for k, v in fields if k != "csrf"})
        assert refused == 403 and len(db.query("SELECT id FROM outbox.messages")) == 5
        async with ui.http.post(
            ui.url + "/dead/purge", data=fields, allow_redirects=False
        ) as response:
            status, location = response.status, response.headers["Location"]
        _, notice = await ui.get(location)
        retry = [("action", "retry"), ("selected", "1"), ("id", str(dead[1]))]
        _, confirm_retry = await ui.get("/dead/confirm", params=retry)
        fields = re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirm_retry)
        async with ui.http.post(ui.url + "/dead/retry", data=fields) as response:
            assert response.status == 200
        none, refusal = await ui.get(
            "/dead/confirm", params=[("action", "retry"), ("selected", "1")]
        )
        many = [("action", "purge")] + [("id", str(i)) for i in range(1, 102)]
        too_many, _ = await ui.get("/dead/confirm", params=many)
        events = [(e["action"], e["rows"], e.get("ids")) for e in ui.events("ui_action")]
    assert sorted(map(int, boxes)) == sorted(dead)
    assert re.search(r'<b id="count">2</b>', confirm)  # the waiting one is not dead
    assert sorted(v for k, v in fields if k == "id") == [str(dead[1])]
    assert status == 303 and location == "/dead?done=purge&count=2"
    assert "Purged 2 dead message(s)." in notice
    remaining = {row[0]: row[1] for row in db.query("SELECT id, state FROM outbox.messages")}
    assert remaining == {dead[1]: "ready", dead[3]: "dead", waiting: "ready"}
    assert none == 400 and "no message selected" in refusal
    assert too_many == 400
    assert events == [
        ("dead_purge", 2, sorted([dead[0], dead[2], waiting])),
        ("dead_retry", 1, [dead[1]]),
    ]


def _form_error(page: str) -> tuple[str, list[str]]:
    """The form's error, and the fields marked invalid."""
    match = re.search(r'id="form-error">([^<]*)<', page)
    assert match is not None, page
    invalid = re.findall(r'name="(\w+)"[^>]*aria-invalid="true"', page)
    return html.unescape(match[1]), invalid


async def test_an_endpoint_is_added_from_its_form_and_refusals_name_the_field(db: Db) -> None:
    async with running(db.url) as ui:
        _, listing = await ui.get("/endpoints")
        _, form_page = await ui.get("/endpoints/new")
        csrf = await ui.csrf("/endpoints/new")
        form = {
            "csrf": csrf,
            "url": "https://hooks.example.com/orders?token=t0k3n",
            "description": "Acme orders",
            "event_types": "order.created\norder.*",
            "filter": "amount > `10`",
            "cap": "4",
            "rate_limit": "2.5",
            "burst": "5",
            "retry_schedule": "5s,1m,90m",
        }
        refusals = {}
        for field, value in (
            ("url", ""),
            ("url", "ftp://hooks.example.com/"),
            ("filter", "amount =="),
            ("retry_schedule", "5s,soon"),
            ("retry_schedule", "5s,9w"),
            ("cap", "0"),
            ("rate_limit", "-1"),
        ):
            status, page = await ui.post("/endpoints/new", form | {field: value})
            refusals[(field, value)] = (status, *_form_error(page))
            assert html.escape(form["description"]) in page  # what was posted, shown again
        status, page = await ui.post("/endpoints/new", form | {"rate_limit": "", "burst": "5"})
        burst_alone = (status, *_form_error(page))
        assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]  # nothing written
        unguarded, _ = await ui.post(
            "/endpoints/new", {k: v for k, v in form.items() if k != "csrf"}
        )
        status, answer = await ui.post("/endpoints/new", form)
        events = ui.events("ui_action")
        log = ui.log.getvalue()
    assert 'id="add"' in listing and 'name="url"' in form_page
    for (field, value), (code, error, invalid) in refusals.items():
        assert code == 400, (field, value)
        assert error.startswith(f"{field}:") and invalid == [field], (field, value, error)
    assert burst_alone[0] == 400 and burst_alone[2] == ["burst"]
    assert unguarded == 403
    assert status == 200 and "is added" in answer
    match = re.search(r'<pre id="secret">(whsec_[A-Za-z0-9+/=]+)</pre>', answer)
    assert match is not None
    with db.tx() as conn:
        (added,) = Endpoints().all(conn)
    assert added.url == form["url"] and added.description == "Acme orders"
    assert added.event_types == ["order.created", "order.*"]
    assert added.filter == "amount > `10`" and added.max_concurrency == 4
    assert (added.rate_limit_per_s, added.burst) == (2.5, 5)
    assert added.retry_schedule == [5, 60, 5400]
    assert [s.secret for s in added.secrets] == [match[1]]
    assert [(e["action"], e["endpoint_id"]) for e in events] == [("endpoint_add", added.id)]
    assert match[1] not in log and "t0k3n" not in log  # neither the secret nor the URL


async def test_an_endpoints_every_setting_is_changed_and_cleared_from_its_page(db: Db) -> None:
    endpoint = db.endpoint(
        event_types=["order.created"], rate_limit=2.5, burst=5, retry_schedule=[5, 60]
    )
    async with running(db.url) as ui:
        _, page = await ui.get(f"/endpoints/{endpoint}")
        shown = dict(re.findall(r'<input name="(\w+)" value="([^"]*)"', page))
        csrf = await ui.csrf(f"/endpoints/{endpoint}")
        form = {
            "csrf": csrf,
            "url": "https://new.example.com/hook",
            "description": "moved",
            "event_types": "refund.created",
            "filter": "amount > `10`",
            "cap": "2",
            "rate_limit": "0.5",
            "burst": "",
            "retry_schedule": "10s,2h",
        }
        saved, _ = await ui.post(f"/endpoints/{endpoint}/edit", form)
        with db.tx() as conn:
            changed = Endpoints().require(conn, endpoint)
        refused, refusal = await ui.post(
            f"/endpoints/{endpoint}/edit", form | {"url": "https://x.example/", "filter": "=="}
        )
        with db.tx() as conn:
            unchanged = Endpoints().require(conn, endpoint)
        cleared_form = form | {"filter": "", "cap": "", "rate_limit": "", "retry_schedule": ""}
        cleared_status, _ = await ui.post(f"/endpoints/{endpoint}/edit", cleared_form)
        events = [(e["action"], e["fields"]) for e in ui.events("ui_action")]
    assert shown["rate_limit"] == "2.5" and shown["burst"] == "5"
    assert shown["retry_schedule"] == "5s,1m" and shown["url"] == "https://example.com/wh"
    assert saved == 303
    assert (changed.url, changed.description) == ("https://new.example.com/hook", "moved")
    assert changed.event_types == ["refund.created"] and changed.filter == "amount > `10`"
    assert changed.max_concurrency == 2 and changed.rate_limit_per_s == 0.5
    assert changed.retry_schedule == [10, 7200]
    assert refused == 400 and _form_error(refusal)[1] == ["filter"]
    assert 'value="https://x.example/"' in refusal  # the form as posted
    assert unchanged.url == changed.url  # the valid URL beside it was not written either
    assert cleared_status == 303
    with db.tx() as conn:
        cleared = Endpoints().require(conn, endpoint)
    assert cleared.filter is None and cleared.max_concurrency is None
    assert cleared.rate_limit_per_s is None and cleared.retry_schedule is None
    assert events[0] == ("endpoint_edit", sorted(set(form) - {"csrf", "cap"} | {"max_concurrency"}))


async def test_an_endpoint_is_deleted_only_from_its_confirmation(db: Db) -> None:
    endpoint = db.endpoint(event_types=["order.created"])
    (waiting,) = db.publish("order.created", "e1")
    async with running(db.url) as ui:
        _, page = await ui.get(f"/endpoints/{endpoint}")
        csrf = await ui.csrf(f"/endpoints/{endpoint}")
        unguarded, _ = await ui.post(f"/endpoints/{endpoint}/delete", {"confirm": "delete"})
        status, location = await ui.post_location(f"/endpoints/{endpoint}/delete", {"csrf": csrf})
        assert (status, location) == (303, f"/endpoints/{endpoint}/delete")
        assert db.query("SELECT count(*) FROM outbox.endpoints") == [(1,)]
        _, confirm = await ui.get(location)
        fields = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirm))
        status, location = await ui.post_location(f"/endpoints/{endpoint}/delete", fields)
        _, listing = await ui.get(location)
        missing, _ = await ui.get(f"/endpoints/{endpoint}/delete")
        events = [(e["action"], e["rows"]) for e in ui.events("ui_action")]
    assert 'id="delete"' in page and unguarded == 403
    assert re.search(r'<b id="pending">1</b>', confirm)
    assert fields == {"csrf": csrf, "confirm": "delete"}
    assert status == 303 and location.startswith("/endpoints?done=delete")
    assert f"Deleted endpoint {endpoint}; its 1 message(s)" in listing
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]
    assert _state(db, waiting) == "dead"
    assert missing == 404
    assert events == [("endpoint_delete", 1)]
