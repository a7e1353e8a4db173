"""The operator dashboard and tenants, against a real database over real HTTP on
127.0.0.1: every list filtered by a tenant (or by none) shows that tenant's rows
only, every row that names an endpoint names its tenant, the tenants list and a
tenant's page, an endpoint added to a tenant from its page, and the 404 of an id
that names no tenant."""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from markupsafe import escape

from outbox import Outbox, Tenants
from outbox.endpoints import Endpoints
from tests.dashboard import HOSTILE, running, serving
from tests.dashboard.test_ui_browser import chromium_binary
from tests.database import Db

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@dataclass(frozen=True)
class Two:
    """Two tenants and the operator's own: an endpoint each, a message waiting,
    one dead and one delivered on each endpoint, and a plain message, dead."""

    own: int
    a: int  # customer-17's endpoint
    b: int  # customer-18's endpoint
    waiting: dict[str, int]
    dead: dict[str, int]
    delivered: dict[str, int]
    plain: int


def _publish(db: Db, key: str, tenant: str | None) -> int:
    with db.tx() as conn:
        (message,) = Outbox().publish(
            conn, "order.paid", {"key": key}, idempotency_key=key, tenant=tenant
        )
    return message


def _delivered(db: Db, endpoint: int, message_id: int) -> None:
    db.query(
        "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, method,"
        " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
        " created_at, completed_at) VALUES (%s, %s, %s, %s, 'POST', '{}', '{}',"
        " 'application/json', 'order.paid', 1, 8, 200, now() - interval '6 minutes',"
        " now() - interval '5 minutes')",
        message_id,
        f"delivered-{message_id}:{endpoint}",
        f"endpoint:{endpoint}",
        endpoint,
    )


def two_tenants(db: Db) -> Two:
    with db.tx() as conn:
        Tenants().add(
            conn,
            "customer-17",
            name="Customer 17",
            metadata={"plan": "gold"},
            rate_limit=2.5,
            burst=5,
            retry_schedule=[5, 60, 600],
        )
        Tenants().add(conn, "customer-18", name="Customer 18")
    own = db.endpoint("https://own.example/wh", event_types=["order.paid"])
    a = db.endpoint("https://a17.example/wh", event_types=["order.paid"], tenant="customer-17")
    b = db.endpoint("https://b18.example/wh", event_types=["order.paid"], tenant="customer-18")
    owners = {"own": None, "customer-17": "customer-17", "customer-18": "customer-18"}
    waiting = {name: _publish(db, f"wait-{name}", tenant) for name, tenant in owners.items()}
    dead = {name: _publish(db, f"dead-{name}", tenant) for name, tenant in owners.items()}
    for message in dead.values():
        db.kill(message)
    delivered = {"own": 9001, "customer-17": 9017, "customer-18": 9018}
    for name, endpoint in (("own", own), ("customer-17", a), ("customer-18", b)):
        _delivered(db, endpoint, delivered[name])
    plain = db.enqueue("plain")
    db.kill(plain)
    return Two(own, a, b, waiting, dead, delivered, plain)


def _links(page: str) -> set[int]:
    """The messages a page links to."""
    return {int(i) for i in re.findall(r'href="/messages/(\d+)"', page)}


def _row(page: str, anchor: str) -> str:
    """The table row of ``page`` that holds ``anchor``."""
    start = page.rindex("<tr", 0, page.index(anchor))
    return page[start : page.index("</tr>", start)]


async def test_each_list_filtered_by_a_tenant_shows_that_tenants_rows_only(db: Db) -> None:
    two = two_tenants(db)
    mine = {*two.waiting.values(), *two.dead.values(), *two.delivered.values(), two.plain}
    of = {
        name: {two.waiting[name], two.dead[name], two.delivered[name]}
        for name in ("own", "customer-17", "customer-18")
    }
    async with running(db.url) as ui:
        _, everything = await ui.get("/messages")
        _, a_messages = await ui.get("/messages", params={"tenant": "customer-17"})
        _, b_dead_messages = await ui.get(
            "/messages", params={"tenant": "customer-18", "state": "dead"}
        )
        _, no_tenants = await ui.get("/messages", params={"tenant": "-"})
        _, a_dead = await ui.get("/dead", params={"tenant": "customer-17"})
        _, none_dead = await ui.get("/dead", params={"tenant": "-"})
        _, every_dead = await ui.get("/dead")
        _, a_endpoints = await ui.get("/endpoints", params={"tenant": "customer-17"})
        _, none_endpoints = await ui.get("/endpoints", params={"tenant": "-"})
        _, every_endpoint = await ui.get("/endpoints")
        _, attention = await ui.get("/", params={"tenant": "customer-18"})
        _, overview = await ui.get("/")
    assert _links(everything) == mine
    assert _links(a_messages) == of["customer-17"]
    assert _links(b_dead_messages) == {two.dead["customer-18"]}
    assert _links(no_tenants) == of["own"] | {two.plain}
    assert 'name="tenant" size="16" value="customer-17"' in a_messages  # the filter in force
    # every row naming an endpoint names its tenant, linked to its page
    row = _row(everything, f'href="/messages/{two.dead["customer-17"]}"')
    assert '<a href="/tenants/customer-17" class="tenant">customer-17</a>' in row
    assert "/tenants/" not in _row(everything, f'href="/messages/{two.dead["own"]}"')

    assert _links(a_dead) == {two.dead["customer-17"]}
    assert _links(none_dead) == {two.dead["own"], two.plain}
    assert '<a href="/tenants/customer-18" class="tenant">customer-18</a>' in _row(
        every_dead, f'href="/messages/{two.dead["customer-18"]}"'
    )

    def endpoints(page: str) -> set[int]:
        return {int(i) for i in re.findall(r'<tr id="endpoint-(\d+)">', page)}

    assert endpoints(every_endpoint) == {two.own, two.a, two.b}
    assert endpoints(a_endpoints) == {two.a}
    assert endpoints(none_endpoints) == {two.own}
    assert "/tenants/customer-17" in _row(every_endpoint, f'id="endpoint-{two.a}"')
    assert 'href="/endpoints/new?tenant=customer-17" id="add"' in a_endpoints

    # the overview's endpoints that need attention (each has a dead message)
    assert f'href="/endpoints/{two.b}"' in attention
    assert f'href="/endpoints/{two.a}"' not in attention
    assert f'href="/endpoints/{two.own}"' not in attention
    assert "Endpoints that need attention of tenant customer-18" in attention
    assert all(f'href="/endpoints/{e}"' in overview for e in (two.own, two.a, two.b))
    assert "/tenants/customer-17" in _row(overview, f'href="/endpoints/{two.a}"')


async def test_a_filter_naming_no_tenant_says_so_and_a_malformed_one_is_refused(db: Db) -> None:
    two_tenants(db)
    async with running(db.url) as ui:
        pages = [
            await ui.get(path, params={"tenant": "customer-99"})
            for path in ("/messages", "/dead", "/endpoints", "/")
        ]
        refusals = [
            await ui.get(path, params={"tenant": HOSTILE})
            for path in ("/messages", "/dead", "/endpoints", "/")
        ]
    for status, page in pages:
        assert status == 200
        assert 'id="unknown-tenant">No tenant has id <code>customer-99</code>' in page
        assert not _links(page)
    for status, page in refusals:
        assert status == 400 and "tenant: " in page and "is not a tenant id" in page
        assert "<script>alert" not in page


async def test_paging_keeps_the_tenant_filter(db: Db) -> None:
    two = two_tenants(db)
    before = max(two.waiting.values()) + 1
    async with running(db.url) as ui:
        _, page = await ui.get("/messages", params={"tenant": "customer-17", "before": before})
        _, endpoints = await ui.get(
            "/endpoints", params={"tenant": "customer-17", "after": 1, "attention": "1"}
        )
    assert 'href="/messages?tenant=customer-17" id="newest-page"' in page
    assert 'href="/endpoints?attention=1&amp;tenant=customer-17" id="first-page"' in endpoints


async def test_retry_all_matching_a_tenant_touches_that_tenants_dead_letters_only(db: Db) -> None:
    two = two_tenants(db)
    async with running(db.url) as ui:
        _, confirm = await ui.get(
            "/dead/confirm", params={"action": "retry", "tenant": "customer-17"}
        )
        fields = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirm))
        status, location = await ui.post_location(
            "/dead/retry", {k: html.unescape(v) for k, v in fields.items()}
        )
        events = ui.events("ui_action")
    assert re.search(r'<b id="count">1</b>', confirm)
    assert 'of tenant <b id="tenant">customer-17</b>' in confirm
    assert set(fields) == {"csrf", "tenant"}
    assert status == 303 and location == "/dead?tenant=customer-17&done=retry&count=1"
    states = dict(db.query("SELECT id, state FROM outbox.messages WHERE state <> 'ready'"))
    assert states == {two.dead["own"]: "dead", two.dead["customer-18"]: "dead", two.plain: "dead"}
    assert [(e["action"], e["rows"], e["tenant"]) for e in events] == [
        ("dead_retry", 1, "customer-17")
    ]


async def test_the_tenants_list_pages_by_id_and_links_each_tenant(db: Db) -> None:
    two_tenants(db)
    db.query(
        "INSERT INTO outbox.tenants (external_id, name)"
        " SELECT 'zz-' || lpad(g::text, 3, '0'), 'Late ' || g FROM generate_series(1, 99) AS g"
    )
    async with running(db.url) as ui:
        _, first = await ui.get("/tenants")
        match = re.search(r'href="/tenants\?([^"]+)" id="next-page"', first)
        assert match is not None
        _, second = await ui.get("/tenants?" + html.unescape(match[1]))
    ids = re.findall(r'<tr id="tenant-([^"]+)">', first)
    assert len(ids) == 100 and ids[:2] == ["customer-17", "customer-18"]
    assert ids[-1] == "zz-098"
    assert re.findall(r'<tr id="tenant-([^"]+)">', second) == ["zz-099"]
    assert 'id="next-page"' not in second and 'href="/tenants" id="first-page"' in second
    row = _row(first, 'id="tenant-customer-17"')
    assert '<a href="/tenants/customer-17" class="tenant">customer-17</a>' in row
    assert "Customer 17" in row and '<a href="/endpoints?tenant=customer-17">1</a>' in row


async def test_a_tenants_page_shows_its_fields_defaults_endpoints_and_links(db: Db) -> None:
    two = two_tenants(db)
    async with running(db.url) as ui:
        status, page = await ui.get("/tenants/customer-17")
        _, messages = await ui.get("/messages?tenant=customer-17")
    assert status == 200
    assert '<span id="tenant-id">customer-17</span>' in page
    assert '<dd id="name">Customer 17</dd>' in page
    assert '<code id="metadata">{&#34;plan&#34;: &#34;gold&#34;}</code>' in page
    assert '<dd id="rate">2.5/s, burst 5</dd>' in page
    assert '<code id="schedule">5s,1m,10m</code>' in page
    assert f'<tr id="endpoint-{two.a}">' in page and "https://a17.example/wh" in page
    assert f'id="endpoint-{two.b}"' not in page and f'id="endpoint-{two.own}"' not in page
    assert 'href="/messages?tenant=customer-17" id="tenant-messages"' in page
    assert 'href="/dead?tenant=customer-17" id="tenant-dead"' in page
    assert 'href="/endpoints/new?tenant=customer-17" id="add"' in page
    assert _links(messages) == {
        two.waiting["customer-17"],
        two.dead["customer-17"],
        two.delivered["customer-17"],
    }


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/tenants/customer-99", "No tenant has id &#39;customer-99&#39;."),
        ("/tenants/-customer", "a tenant&#39;s id is 1-128 letters, digits and ._:@-"),
        ("/tenants/%3Cscript%3Ealert(1)%3C%2Fscript%3E", "a tenant&#39;s id is 1-128 letters"),
        ("/endpoints/new?tenant=customer-99", "No tenant has id &#39;customer-99&#39;."),
    ],
)
async def test_a_tenant_address_that_names_no_tenant_is_a_404_saying_so(
    db: Db, path: str, says: str
) -> None:
    two_tenants(db)
    async with running(db.url) as ui:
        status, page = await ui.get(path)
    assert status == 404
    assert says in page and "<script>alert" not in page


async def test_an_endpoint_added_from_a_tenants_page_is_that_tenants_with_its_defaults(
    db: Db,
) -> None:
    two_tenants(db)
    async with running(db.url) as ui:
        _, form = await ui.get("/endpoints/new?tenant=customer-17")
        csrf = await ui.csrf("/endpoints/new?tenant=customer-17")
        posted = {"url": "https://new17.example/wh", "tenant": "customer-17"}
        forged, _ = await ui.post("/endpoints/new", posted)  # no CSRF token
        status, answer = await ui.post("/endpoints/new", {**posted, "csrf": csrf})
        unknown, refusal = await ui.post(
            "/endpoints/new", {**posted, "tenant": "customer-99", "csrf": csrf}
        )
        events = ui.events("ui_action")
    assert 'id="for-tenant">For tenant <a href="/tenants/customer-17"' in form
    assert "(2.5/s, burst 5; <code>5s,1m,10m</code>)" in form
    assert '<input type="hidden" name="tenant" value="customer-17">' in form
    assert forged == 403 and status == 200 and '<pre id="secret">whsec_' in answer
    assert unknown == 400 and "no tenant with id &#39;customer-99&#39;" in refusal
    assert '<input type="hidden" name="tenant" value="customer-99">' in refusal
    with db.tx() as conn:
        (added,) = [
            e
            for e in Endpoints().all(conn, tenant="customer-17")
            if e.url == "https://new17.example/wh"
        ]
    assert (added.rate_limit_per_s, added.burst, added.retry_schedule) == (2.5, 5, [5, 60, 600])
    assert [(e["action"], e["tenant"]) for e in events] == [("endpoint_add", "customer-17")]


async def test_a_message_and_an_endpoint_name_their_tenant(db: Db) -> None:
    two = two_tenants(db)
    async with running(db.url) as ui:
        _, message = await ui.get(f"/messages/{two.dead['customer-17']}")
        _, own_message = await ui.get(f"/messages/{two.dead['own']}")
        _, endpoint = await ui.get(f"/endpoints/{two.a}")
        _, own = await ui.get(f"/endpoints/{two.own}")
    assert '<dd id="tenant"><a href="/tenants/customer-17" class="tenant">' in message
    assert '<dd id="tenant">-</dd>' in own_message
    assert '<dd id="tenant"><a href="/tenants/customer-17" class="tenant">' in endpoint
    assert "none: it gets the events published for no tenant" in own


async def test_read_only_serves_the_tenant_pages_without_any_action(db: Db) -> None:
    two_tenants(db)
    async with running(db.url, read_only=True) as ui:
        pages = [await ui.get(p) for p in ("/tenants", "/tenants/customer-17")]
        status, _ = await ui.post("/endpoints/new", {"url": "https://x.example", "tenant": "x"})
    for code, page in pages:
        assert code == 200 and "read-only" in page
        assert "/endpoints/new" not in page and "csrf" not in page
    assert status in (403, 405)
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(3,)]


async def test_a_tenants_name_and_metadata_render_as_text(db: Db) -> None:
    with db.tx() as conn:
        Tenants().add(conn, "customer-1", name=HOSTILE, metadata={"note": HOSTILE})
    async with running(db.url) as ui:
        pages = [await ui.get(p) for p in ("/tenants", "/tenants/customer-1")]
    for status, page in pages:
        assert status == 200
        assert "<script>alert" not in page and str(escape(HOSTILE)) in page


@pytest.fixture
def chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    return binary


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_an_operator_filters_by_tenant_and_opens_a_tenants_page(
    database_url: str, chromium: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    shots = Path(os.environ.get("OUTBOX_TEST_ARTIFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    db = Db(database_url)
    two = two_tenants(db)
    command = ["ui", "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)

        page.goto(url)
        page.get_by_role("link", name="Tenants", exact=True).click()
        expect(page.locator("tbody tr")).to_have_count(2)
        page.screenshot(path=shots / "tenants.png", full_page=True)
        page.get_by_role("link", name="customer-17", exact=True).click()
        expect(page.locator("#tenant-id")).to_have_text("customer-17")
        expect(page.locator("#rate")).to_have_text("2.5/s, burst 5")
        expect(page.locator(f"#endpoint-{two.a}")).to_be_visible()
        page.screenshot(path=shots / "tenant.png", full_page=True)

        page.locator("#tenant-messages").click()
        rows = page.locator("main tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.locator("a.tenant")).to_have_text(["customer-17"] * 3)

        # as a person would: the filter form of the list, then a row's tenant
        page.get_by_role("link", name="Messages", exact=True).click()
        expect(rows).to_have_count(10)  # every message: 3 a side, and one plain
        page.fill('input[name="tenant"]', "customer-18")
        page.get_by_role("button", name="Find").click()
        expect(rows).to_have_count(3)
        expect(rows.locator("a.tenant")).to_have_text(["customer-18"] * 3)
        expect(page.locator('input[name="tenant"]')).to_have_value("customer-18")
        page.screenshot(path=shots / "messages-by-tenant.png", full_page=True)
        rows.first.locator("a.tenant").click()
        expect(page.locator("#tenant-id")).to_have_text("customer-18")

        page.get_by_role("link", name="Dead letters", exact=True).click()
        page.fill('input[name="tenant"]', "-")
        page.get_by_role("button", name="Filter").click()
        expect(rows).to_have_count(2)  # the operator's endpoint's, and the plain one
        expect(rows.locator("a.tenant")).to_have_count(0)
        page.screenshot(path=shots / "dead-of-no-tenant.png", full_page=True)

        # the overview refreshes every 5 seconds, but not while its tenant
        # field is being filled in (it would lose what was typed)
        refreshes: list[str] = []
        page.on(
            "request", lambda r: refreshes.append(r.url) if r.resource_type == "fetch" else None
        )
        page.clock.install()
        page.get_by_role("link", name="Overview", exact=True).click()
        attention = page.locator("#attention-endpoints tbody tr")
        expect(attention).to_have_count(3)
        field = page.locator('input[name="tenant"]')
        field.fill("customer-1")
        page.clock.run_for(6_000)
        expect(field).to_have_value("customer-1")
        page.locator("h1").click()  # the field left: the next turn refreshes
        with page.expect_request(lambda r: r.resource_type == "fetch"):
            page.clock.run_for(6_000)
        expect(field).to_have_value("")  # the page as served again, swapped in
        assert refreshes == [url]
        page.fill('input[name="tenant"]', "customer-17")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("#attention")).to_have_text(
            "Endpoints that need attention of tenant customer-17"
        )
        expect(attention).to_have_count(1)
        expect(attention.locator("a.tenant")).to_have_text("customer-17")
        page.screenshot(path=shots / "overview-by-tenant.png", full_page=True)
        browser.close()
