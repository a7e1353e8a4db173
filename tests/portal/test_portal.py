"""The consumer portal over real HTTP on 127.0.0.1, against a real database: the
token guard (unknown, expired, revoked), the headers, CSRF, the walls between
tenants on every route, and every page and action."""

from __future__ import annotations

import hashlib

import psycopg
import pytest
from markupsafe import escape

from outbox import Outbox
from outbox.endpoints import Endpoints
from outbox.portal import TOKEN_PREFIX, revoke
from outbox.sealing import Keyring, generate_key
from outbox.secrets import fingerprint
from tests.dashboard import HOSTILE
from tests.database import Db
from tests.dispatching import drain, fast_config
from tests.plans import reads_by, whole_reads
from tests.portal import endpoint, expire, link, serving, tenant
from tests.receiver import Receiver

pytestmark = pytest.mark.timeout(60)

EXPIRED = "This link has expired or was revoked."

# every route of the portal with an endpoint or message id: GET pages, then POST actions
ENDPOINT_PAGES = ("endpoints/{id}", "endpoints/{id}/rotate-secret", "endpoints/{id}/delete")
ENDPOINT_ACTIONS = {
    "endpoints/{id}/edit": {"url": "https://evil.example/x", "event_types": "a.b"},
    "endpoints/{id}/enable": {},
    "endpoints/{id}/disable": {},
    "endpoints/{id}/secret": {},
    "endpoints/{id}/rotate-secret": {"confirm": "rotate"},
    "endpoints/{id}/test": {},
    "endpoints/{id}/delete": {"confirm": "delete"},
}
MESSAGE_PAGES = ("deliveries/{id}",)
MESSAGE_ACTIONS = {"deliveries/{id}/replay": {}}


def _delivered(db: Db, message_id: int) -> None:
    """Move a message to the history as a dispatcher's delivery would."""
    db.query(
        "WITH moved AS (DELETE FROM outbox.messages WHERE id = %s RETURNING *)"
        " INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, url, method,"
        " headers, body, content_type, event_type, ordering_key, attempts, max_attempts,"
        " last_status, created_at, completed_at)"
        " SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,"
        " content_type, event_type, ordering_key, 1, max_attempts, 200, created_at, now()"
        " FROM moved",
        message_id,
    )
    db.query(
        "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, duration_ms,"
        " status, outcome) VALUES (%s, 1, 'test:1:x', now(), 7, 200, 'delivered')",
        message_id,
    )


def _publish(db: Db, tenant_id: str, key: str) -> list[int]:
    with db.tx() as conn:
        return Outbox().publish(
            conn, "order.paid", {"key": key}, idempotency_key=key, tenant=tenant_id
        )


def _endpoint_row(db: Db, endpoint_id: int) -> list[tuple[object, ...]]:
    return db.query(
        "SELECT e.url, e.event_types, e.enabled, array_agg(s.secret ORDER BY s.id)"
        " FROM outbox.endpoints e JOIN outbox.endpoint_secrets s ON s.endpoint_id = e.id"
        " WHERE e.id = %s GROUP BY e.id",
        endpoint_id,
    )


async def test_a_link_opens_its_tenants_pages_and_no_other_token_opens_any(
    database_url: str,
) -> None:
    tenant(database_url, "customer-17", name="Customer Seventeen")
    endpoint(database_url, "customer-17", "https://hooks.customer17.example/orders")
    good, expired, revoked = (link(database_url, "customer-17") for _ in range(3))
    expire(database_url, expired)
    with psycopg.connect(database_url) as conn:
        revoke(conn, revoked.token)
    async with serving(database_url) as portal:
        status, page = await portal.get(good.url_path)
        assert status == 200
        assert "Customer Seventeen" in page and "https://hooks.customer17.example/orders" in page
        status, _ = await portal.get(good.url_path.rstrip("/"))
        assert status == 303
        for token in (expired.token, revoked.token, TOKEN_PREFIX + "A" * 43, "x", good.token + "A"):
            for path in ("/", "/deliveries", "/endpoints/1", "/deliveries/1", "/endpoints/new"):
                status, page = await portal.get(f"/portal/{token}{path}")
                assert status == 404, (token, path)
                assert EXPIRED in page and "Customer Seventeen" not in page
            status, page, _ = await portal.post(
                f"/portal/{token}/endpoints/new", {"url": "https://x.example/"}
            )
            assert status == 404 and EXPIRED in page
        status, page = await portal.get(good.url_path + "no-such-page")
        assert status == 404 and "no such page" in page
    assert Db(database_url).query("SELECT count(*) FROM outbox.endpoints") == [(1,)]


async def test_portal_pages_send_the_dashboards_policy_with_their_frame_ancestors(
    database_url: str,
) -> None:
    tenant(database_url, "customer-17")
    made = link(database_url, "customer-17")
    paths = (made.url_path, made.url_path + "deliveries", "/portal/nothing/", made.url_path + "x")
    async with serving(database_url) as portal:
        dashboard = await portal.response("GET", "/")
        for path in paths:
            response = await portal.response("GET", path)
            csp = response.headers["Content-Security-Policy"]
            assert csp == dashboard.headers["Content-Security-Policy"], path
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
            assert response.headers["X-Frame-Options"] == "DENY"
            assert response.headers["Referrer-Policy"] == "no-referrer"
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Cache-Control"] == "no-store"
            assert "Set-Cookie" not in response.headers  # the token is the session
    ancestors = ("https://app.example.com", "https://*.example.org:8443")
    async with serving(database_url, ancestors=ancestors) as portal:
        response = await portal.response("GET", made.url_path)
        csp = response.headers["Content-Security-Policy"]
        directive = "frame-ancestors https://app.example.com https://*.example.org:8443"
        assert directive in csp.split("; ")
        assert csp.count("frame-ancestors") == 1 and "default-src 'none'" in csp
        assert "X-Frame-Options" not in response.headers
        dashboard = await portal.response("GET", "/")  # the operator's pages are never framed
        assert "frame-ancestors 'none'" in dashboard.headers["Content-Security-Policy"]
        assert dashboard.headers["X-Frame-Options"] == "DENY"


async def test_a_form_without_the_links_csrf_field_is_refused_and_changes_nothing(
    database_url: str,
) -> None:
    tenant(database_url, "customer-17")
    tenant(database_url, "customer-18")
    mine, theirs = link(database_url, "customer-17"), link(database_url, "customer-18")
    mine_endpoint = endpoint(database_url, "customer-17")
    before = _endpoint_row(Db(database_url), mine_endpoint)
    async with serving(database_url) as portal:
        other = await portal.csrf(theirs.url_path + "endpoints/new")
        for csrf in (None, "", other, other.upper()):
            data = {"url": "https://new.example/"} | ({} if csrf is None else {"csrf": csrf})
            status, page, _ = await portal.post(mine.url_path + "endpoints/new", data)
            assert status == 403 and "reload the page" in page
            for action, form in ENDPOINT_ACTIONS.items():
                path = mine.url_path + action.format(id=mine_endpoint)
                status, _, _ = await portal.post(
                    path, form | ({} if csrf is None else {"csrf": csrf})
                )
                assert status == 403, action
    db = Db(database_url)
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(1,)]
    assert _endpoint_row(db, mine_endpoint) == before
    assert db.query("SELECT count(*) FROM outbox.messages") == [(0,)]


async def test_another_tenants_endpoints_and_messages_are_not_found_on_any_route(
    database_url: str,
) -> None:
    db = Db(database_url)
    tenant(database_url, "customer-17")
    tenant(database_url, "customer-18")
    mine = endpoint(database_url, "customer-17", "https://mine.example/hook")
    theirs = endpoint(database_url, "customer-18", "https://theirs.example/hook")
    operators = endpoint(database_url, None, "https://operator.example/hook")
    with db.tx() as conn:
        Endpoints().update(conn, theirs, event_types=["order.paid"])
    (their_waiting,) = _publish(db, "customer-18", "theirs-1")
    (their_delivered,) = _publish(db, "customer-18", "theirs-2")
    _delivered(db, their_delivered)
    (my_message,) = _publish(db, "customer-17", "mine-1")
    missing = 10**9
    before = [_endpoint_row(db, theirs), _endpoint_row(db, operators)]
    messages_before = db.query("SELECT id, state, attempts FROM outbox.messages ORDER BY id")
    made = link(database_url, "customer-17")
    base = made.url_path
    async with serving(database_url) as portal:
        csrf = await portal.csrf(base + "endpoints/new")
        for template in ENDPOINT_PAGES:
            _, nothing = await portal.get(base + template.format(id=missing))
            for other in (theirs, operators):
                status, page = await portal.get(base + template.format(id=other))
                assert (status, page) == (404, nothing), template
        for action, form in ENDPOINT_ACTIONS.items():
            _, nothing, _ = await portal.post(
                base + action.format(id=missing), form | {"csrf": csrf}
            )
            for other in (theirs, operators):
                status, page, _ = await portal.post(
                    base + action.format(id=other), form | {"csrf": csrf}
                )
                assert (status, page) == (404, nothing), action
        for template in MESSAGE_PAGES:
            _, nothing = await portal.get(base + template.format(id=missing))
            for other in (their_waiting, their_delivered):
                assert await portal.get(base + template.format(id=other)) == (404, nothing)
        for action, form in MESSAGE_ACTIONS.items():
            _, nothing, _ = await portal.post(
                base + action.format(id=missing), form | {"csrf": csrf}
            )
            for other in (their_waiting, their_delivered):
                status, page, _ = await portal.post(
                    base + action.format(id=other), form | {"csrf": csrf}
                )
                assert (status, page) == (404, nothing), action
        # the lists hold only the tenant's own
        pages = [
            await portal.get(base),
            await portal.get(base + "deliveries"),
            await portal.get(base + f"deliveries?endpoint={theirs}"),
        ]
        status, own = await portal.get(base + f"deliveries/{my_message}")
        assert status == 200 and "mine.example" in own
    for status, page in pages:
        assert status == 200
        assert "theirs.example" not in page and "operator.example" not in page
    assert f'data-message="{my_message}"' in pages[1][1]
    assert f'data-message="{their_waiting}"' not in pages[1][1]
    assert f'data-message="{their_delivered}"' not in pages[2][1]
    assert [_endpoint_row(db, theirs), _endpoint_row(db, operators)] == before
    assert (
        db.query("SELECT id, state, attempts FROM outbox.messages ORDER BY id") == messages_before
    )
    assert db.query("SELECT state FROM outbox.messages WHERE id = %s", their_delivered) == []
    assert mine  # the tenant's own endpoint exists beside them


async def test_a_tenant_adds_edits_reveals_rotates_tests_disables_and_deletes_an_endpoint(
    database_url: str,
) -> None:
    db = Db(database_url)
    tenant(database_url, "customer-17", retry_schedule=[5, 60])
    made = link(database_url, "customer-17")
    base = made.url_path
    async with serving(database_url) as portal:
        csrf = await portal.csrf(base + "endpoints/new")
        status, page, _ = await portal.post(
            base + "endpoints/new", {"csrf": csrf, "url": "not a url", "event_types": "a.b"}
        )
        assert status == 400 and "url:" in page and "Nothing was saved" in page
        assert 'value="not a url"' in page
        status, page, _ = await portal.post(
            base + "endpoints/new",
            {"csrf": csrf, "url": "https://hooks.example.com/o", "description": HOSTILE,
             "event_types": "order.paid, order.*"},
        )  # fmt: skip
        assert status == 200, page
        ((endpoint_id, tenant_key, schedule, types),) = db.query(
            "SELECT e.id, t.external_id, e.retry_schedule, e.event_types FROM outbox.endpoints e"
            " JOIN outbox.tenants t ON t.id = e.tenant_id"
        )
        assert (tenant_key, schedule, types) == ("customer-17", [5, 60], ["order.paid", "order.*"])
        ((secret,),) = db.query("SELECT secret FROM outbox.endpoint_secrets")
        assert f'<pre class="secret" id="secret">{secret}</pre>' in page
        status, page = await portal.get(base + f"endpoints/{endpoint_id}")
        assert status == 200 and secret not in page and fingerprint(secret) in page
        assert str(escape(HOSTILE)) in (await portal.get(base))[1]
        assert "<script>alert" not in page

        path = base + f"endpoints/{endpoint_id}"
        status, _, location = await portal.post(
            path + "/edit", {"csrf": csrf, "url": "https://hooks.example.com/v2", "event_types": ""}
        )
        assert (status, location) == (303, path + "?done=edit")
        assert db.query("SELECT url, event_types FROM outbox.endpoints") == [
            ("https://hooks.example.com/v2", [])
        ]
        status, page, _ = await portal.post(path + "/edit", {"csrf": csrf, "url": "ftp://x"})
        assert status == 400 and "url:" in page

        status, page, _ = await portal.post(path + "/secret", {"csrf": csrf})
        assert status == 200 and f'id="secret">{secret}</pre>' in page
        status, page, location = await portal.post(path + "/rotate-secret", {"csrf": csrf})
        assert (status, location) == (303, path + "/rotate-secret")  # not confirmed
        status, page, _ = await portal.post(
            path + "/rotate-secret", {"csrf": csrf, "confirm": "rotate"}
        )
        assert status == 200
        rotated = db.query("SELECT secret FROM outbox.endpoint_secrets ORDER BY id")
        assert len(rotated) == 2 and f'id="secret">{rotated[1][0]}</pre>' in page

        status, _, location = await portal.post(path + "/test", {"csrf": csrf})
        ((test_id, event_type),) = db.query("SELECT id, event_type FROM outbox.messages")
        assert (status, location, event_type) == (
            303,
            base + f"deliveries/{test_id}",
            "outbox.test",
        )
        status, page = await portal.get(location)
        assert status == 200 and "No attempt yet." in page

        status, _, _ = await portal.post(path + "/disable", {"csrf": csrf})
        assert db.query("SELECT enabled, disabled_reason FROM outbox.endpoints") == [
            (False, "disabled from the portal")
        ]
        status, page, _ = await portal.post(path + "/test", {"csrf": csrf})
        assert status == 409 and "disabled" in page
        await portal.post(path + "/enable", {"csrf": csrf})
        assert db.query("SELECT enabled FROM outbox.endpoints") == [(True,)]

        status, page = await portal.get(path + "/delete")
        assert status == 200 and 'id="confirm-delete"' in page
        status, _, location = await portal.post(
            path + "/delete", {"csrf": csrf, "confirm": "delete"}
        )
        assert (status, location) == (303, base + f"?deleted={endpoint_id}&count=1")
        assert "Deleted endpoint" in (await portal.get(location))[1]
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]
    # the log names the link and the tenant, never the token, never a secret
    log = portal.log.getvalue()
    actions = [e["action"] for e in portal.events("portal_action")]
    assert actions == [
        "endpoint_add", "endpoint_edit", "endpoint_reveal_secret", "endpoint_rotate_secret",
        "endpoint_test_event", "endpoint_disable", "endpoint_enable", "endpoint_delete",
    ]  # fmt: skip
    assert {(e["tenant"], e["link"]) for e in portal.events("portal_action")} == {
        ("customer-17", made.id)
    }
    assert made.token not in log and hashlib.sha256(made.token.encode()).hexdigest() not in log
    assert secret not in log and rotated[1][0] not in log


@pytest.mark.slow
async def test_a_published_event_is_delivered_seen_with_its_attempt_and_replayed(
    database_url: str,
) -> None:
    db = Db(database_url)
    tenant(database_url, "customer-17")
    made = link(database_url, "customer-17")
    with Receiver() as receiver:
        endpoint_id = endpoint(database_url, "customer-17", receiver.url + "/hook")
        (message_id,) = _publish(db, "customer-17", "order-42")
        await drain(db, fast_config())  # type: ignore[arg-type]
        assert len(receiver.requests) == 1
    async with serving(database_url) as portal:
        status, page = await portal.get(made.url_path + "deliveries")
        assert status == 200 and f'data-message="{message_id}"' in page and "delivered" in page
        status, page = await portal.get(made.url_path + f"deliveries/{message_id}")
        assert status == 200 and f"order-42:{endpoint_id}" in page
        assert '<span class="status">200</span>' in page
        assert str(escape('"key":"order-42"')) in page
        csrf = await portal.csrf(made.url_path + f"deliveries/{message_id}")
        status, _, location = await portal.post(
            made.url_path + f"deliveries/{message_id}/replay", {"csrf": csrf}
        )
        assert status == 303 and location.endswith("?done=replay&count=1")
        assert "Replayed" in (await portal.get(location))[1]
    assert db.query("SELECT state FROM outbox.messages WHERE id = %s", message_id) == [("ready",)]


async def test_read_only_serves_the_pages_and_no_action(database_url: str) -> None:
    tenant(database_url, "customer-17")
    endpoint_id = endpoint(database_url, "customer-17")
    made = link(database_url, "customer-17")
    async with serving(database_url, read_only=True) as portal:
        for path in ("", f"endpoints/{endpoint_id}", "deliveries"):
            status, page = await portal.get(made.url_path + path)
            assert status == 200 and 'method="post"' not in page and "read-only" in page
        status, _ = await portal.get(made.url_path + "endpoints/new")
        assert status == 404
        for action, form in ENDPOINT_ACTIONS.items():
            status, _, _ = await portal.post(made.url_path + action.format(id=endpoint_id), form)
            assert status in (404, 405), action
    assert len(_endpoint_row(Db(database_url), endpoint_id)[0][3]) == 1  # type: ignore[arg-type]


async def test_sealed_secrets_open_with_the_key_and_without_it_say_so(database_url: str) -> None:
    key = Keyring.from_text(generate_key(), "test key")
    tenant(database_url, "customer-17")
    with psycopg.connect(database_url) as conn:
        endpoint_id = (
            Endpoints(keyring=key)
            .add(conn, url="https://e.example/", tenant="customer-17", secret="whsec_" + "D" * 44)
            .id
        )
    made = link(database_url, "customer-17")
    path = made.url_path + f"endpoints/{endpoint_id}"
    async with serving(database_url, keyring=key) as portal:
        csrf = await portal.csrf(path)
        status, page, _ = await portal.post(path + "/secret", {"csrf": csrf})
        assert status == 200 and "whsec_" + "D" * 44 in page
    async with serving(database_url) as portal:
        status, page = await portal.get(path)
        assert status == 200 and "sealed: unavailable" in page
        status, page, _ = await portal.post(path + "/secret", {"csrf": csrf})
        assert status == 409 and "sealed under a key this server was not given" in page
        status, page, _ = await portal.post(
            made.url_path + "endpoints/new", {"csrf": csrf, "url": "https://new.example/"}
        )
        assert status == 409 and "would be stored in plain text" in page
    assert Db(database_url).query("SELECT count(*) FROM outbox.endpoints") == [(1,)]


async def test_a_portal_request_naming_another_host_is_refused(database_url: str) -> None:
    tenant(database_url, "customer-17")
    made = link(database_url, "customer-17")
    async with serving(database_url) as portal:
        response = await portal.response("GET", made.url_path, headers={"Host": "evil.example"})
        assert response.status == 421


@pytest.mark.slow
def test_the_portals_statements_read_one_tenants_rows_through_indexes(database_url: str) -> None:
    # a tenant among many, and a long history of two thousand endpoints (deleted
    # ones too: the history keeps their rows)
    from dispatchers.store.statements import web_queries
    from dispatchers.ui.store import READ_ONLY

    db = Db(database_url)
    for n in range(20):
        tenant(database_url, f"customer-{n}")
        endpoint(database_url, f"customer-{n}", f"https://c{n}.example/hook")
    db.query(
        "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, url, method,"
        " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
        " created_at, completed_at)"
        " SELECT g, 'k' || g, 'endpoint:' || (g %% 2000 + 1), g %% 2000 + 1, NULL, 'POST',"
        " '{}', '', 'application/json', 'order.paid', 1, 8, 200, now() - g * interval '1 second',"
        " now() - g * interval '1 second' FROM generate_series(1, 40000) AS g"
    )
    db.query(
        "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, status, outcome)"
        " SELECT g, 1, 'o', now() - g * interval '1 second', 200, 'delivered'"
        " FROM generate_series(1, 40000) AS g"
    )
    db.query("SELECT setval('outbox.messages_id_seq', 50000)")
    for n in range(5):
        _publish(db, f"customer-{n}", f"waiting-{n}")
    db.query("ANALYZE")

    def plan(name: str, **params: object) -> str:
        with db.tx() as conn:
            conn.execute(READ_ONLY)
            text = web_queries("outbox")[name].text
            rows = conn.execute("EXPLAIN " + text, params).fetchall()
        return "\n".join(str(r[0]) for r in rows)

    # endpoints and the queue are small here (a sequential scan is their best
    # plan); the history and the attempts are what grow
    # (the history's indexes on each of its partitions; empty partitions made
    # ahead may be read whole, at no cost)
    for endpoint_id in (None, 3):
        recent = plan("web_deliveries", tenant_id=3, endpoint_id=endpoint_id, limit=100)
        assert reads_by(database_url, recent, "delivered_endpoint_idx"), recent
        assert whole_reads(database_url, recent, "delivered") == [], recent
    message = plan("web_message", tenant_id=3, id=43)
    assert reads_by(database_url, message, "delivered_pkey"), message
    assert whole_reads(database_url, message, "delivered") == [], message
    attempts = plan("web_message_attempts", tenant_id=3, id=43)
    assert reads_by(database_url, attempts, "attempts_pkey"), attempts
    assert whole_reads(database_url, attempts, "attempts") == [], attempts
