"""The consumer portal in a real browser: Playwright driving the system's
Chromium against a running ``outbox ui``, a link made by ``outbox
portal-link``, a real dispatcher and a receiver on 127.0.0.1.

Skipped, saying why, where Chromium or Playwright is missing (as the
dashboard's browser tests are). Screenshots of each page go to
``$OUTBOX_TEST_ARTIFACTS`` when set, else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import Outbox
from outbox.endpoints import Endpoints
from tests.dashboard import serving, test_ui_browser
from tests.database import Db
from tests.dispatching import drain, fast_config
from tests.portal import expire, tenant
from tests.receiver import Receiver

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]

chromium = test_ui_browser.chromium  # the browser, or a skip saying how to install it
artifacts = test_ui_browser.artifacts  # where screenshots go


def _deliver(db: Db) -> None:
    """Run a dispatcher until nothing is due, in a thread of its own (Playwright's
    sync API holds this thread's event loop)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(drain(db, fast_config()))
        except BaseException as exc:  # raised again in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the dispatcher did not drain in time"
    if failed:
        raise failed[0]


def _portal_link(database_url: str, base_url: str, tenant_id: str) -> str:
    """``outbox portal-link``, as an operator's script runs it: the URL alone."""
    done = subprocess.run(
        [sys.executable, "-m", "dispatchers.cli", "portal-link", "--tenant", tenant_id,
         "--expires", "1h", "--base-url", base_url, "--database-url", database_url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.mark.slow
def test_a_tenant_adds_an_endpoint_sees_its_delivery_and_the_link_then_expires(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = Db(database_url)
    tenant(database_url, "customer-17", name="Customer Seventeen")
    tenant(database_url, "customer-18")
    with psycopg.connect(database_url) as conn:  # another tenant's, never shown
        Endpoints().add(conn, url="https://other-tenant.example/hook", tenant="customer-18")
    command = ["ui", "--port", "0", "--database-url", database_url]
    with (
        Receiver() as receiver,
        serving(command, tmp_path / "ui.log") as url,
        sync_playwright() as playwright,
    ):
        link = _portal_link(database_url, url.rstrip("/"), "customer-17")
        assert link.startswith(url + "portal/obp_") and link.endswith("/")
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))

        page.goto(link)
        expect(page.locator("#tenant")).to_contain_text("Customer Seventeen")
        expect(page.locator("#no-endpoints")).to_be_visible()
        page.screenshot(path=artifacts / "portal-home-empty.png", full_page=True)

        page.locator("#add").click()
        page.fill('input[name="url"]', "not a url")
        page.locator("#save").click()
        expect(page.locator("#form-error")).to_contain_text("url:")
        page.screenshot(path=artifacts / "portal-endpoint-form-error.png", full_page=True)
        page.fill('input[name="url"]', receiver.url + "/orders")
        page.fill('input[name="description"]', "Order events")
        page.fill('textarea[name="event_types"]', "order.*")
        page.screenshot(path=artifacts / "portal-endpoint-new.png", full_page=True)
        page.locator("#save").click()
        secret = page.locator("#secret").inner_text()
        assert secret.startswith("whsec_")
        page.screenshot(path=artifacts / "portal-endpoint-added.png", full_page=True)
        page.locator("#back").click()
        expect(page.locator("#event-types")).to_have_text("order.*")
        assert secret not in page.content()  # shown once, on the answer only

        # the product publishes for its customer; a dispatcher delivers it
        with db.tx() as conn:
            (message_id,) = Outbox().publish(
                conn, "order.paid", {"order_id": 42}, idempotency_key="o-42", tenant="customer-17"
            )
        _deliver(db)
        assert [r.path for r in receiver.requests] == ["/orders"]

        page.reload()
        expect(page.locator(f'tr[data-message="{message_id}"]')).to_contain_text("delivered")
        page.screenshot(path=artifacts / "portal-endpoint.png", full_page=True)
        page.get_by_role("link", name="Deliveries").click()
        row = page.locator(f'tr[data-message="{message_id}"]')
        expect(row).to_contain_text("delivered")
        expect(page.locator("#deliveries tbody tr")).to_have_count(1)
        page.screenshot(path=artifacts / "portal-deliveries.png", full_page=True)
        row.get_by_role("link", name=str(message_id), exact=True).click()
        expect(page.locator("#state")).to_have_text("delivered")
        expect(page.locator("#attempts li")).to_have_count(1)
        expect(page.locator("#attempts .status")).to_have_text("200")
        page.screenshot(path=artifacts / "portal-message.png", full_page=True)
        page.locator("#replay").click()
        expect(page.locator("#notice")).to_contain_text("Replayed")
        expect(page.locator("#state")).to_have_text("ready")
        _deliver(db)
        assert len(receiver.requests) == 2

        page.locator("#endpoint").click()
        page.locator("#reveal").click()
        expect(page.locator("#secret")).to_have_text(secret)
        page.screenshot(path=artifacts / "portal-secret-revealed.png", full_page=True)
        page.locator("#back").click()
        page.locator("#rotate").click()
        expect(page.locator("#confirm-rotate")).to_be_visible()
        page.screenshot(path=artifacts / "portal-rotate-confirm.png", full_page=True)
        page.locator("#confirm-rotate").click()
        rotated = page.locator("#secret").inner_text()
        assert rotated.startswith("whsec_") and rotated != secret
        page.screenshot(path=artifacts / "portal-secret-rotated.png", full_page=True)
        page.locator("#back").click()
        page.locator("#test-event").click()
        expect(page.locator("h1")).to_contain_text("Message")
        _deliver(db)
        page.reload()
        expect(page.locator("#state")).to_have_text("delivered")
        page.screenshot(path=artifacts / "portal-test-event.png", full_page=True)
        page.locator("#endpoint").click()
        page.locator("#delete").click()
        expect(page.locator("#confirm-delete")).to_be_visible()
        page.screenshot(path=artifacts / "portal-delete-confirm.png", full_page=True)
        page.goto(link)
        page.screenshot(path=artifacts / "portal-home.png", full_page=True)
        assert "other-tenant.example" not in page.content()

        # the link's time runs out: every page of it refuses
        expire(database_url, _made(database_url))
        page.reload()
        expect(page.locator("#refused")).to_contain_text("expired or was revoked")
        expect(page.locator("#tenant")).to_have_count(0)
        page.screenshot(path=artifacts / "portal-expired.png", full_page=True)
        browser.close()

    assert dialogs == []
    assert [r for r in requests if not r.startswith(url)] == []


def _made(database_url: str) -> Any:
    """The one link of the test, as :func:`tests.portal.expire` takes it."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT id FROM outbox.portal_links").fetchone()
    assert row is not None

    class Made:
        id = row[0]

    return Made()


class _Product:
    """A page of another origin (``localhost``, not ``127.0.0.1``) that shows
    :attr:`frame` in an iframe, as a product's page embeds the portal."""

    def __init__(self) -> None:
        self.frame = "about:blank"
        product = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                html = (
                    "<!doctype html><title>Your product</title><h1>Your product</h1>"
                    f'<iframe id="portal" src="{product.frame}" width="1200" height="640">'
                    "</iframe>"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(html)))
                self.end_headers()
                self.wfile.write(html)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://localhost:{self.server.server_address[1]}"

    @contextlib.contextmanager
    def serving(self) -> Iterator[_Product]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@pytest.mark.slow
def test_the_portal_works_in_a_frame_of_the_allowed_site_and_no_other(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    tenant(database_url, "customer-17", name="Customer Seventeen")
    command = ["ui", "--port", "0", "--database-url", database_url]
    with (
        _Product().serving() as product,
        serving([*command, "--portal-frame-ancestors", product.origin], tmp_path / "a.log") as ui,
        serving(command, tmp_path / "b.log") as unframed,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        product.frame = _portal_link(database_url, ui.rstrip("/"), "customer-17")
        page.goto(product.origin)
        portal = page.frame_locator("#portal")
        expect(portal.locator("#tenant")).to_contain_text("Customer Seventeen")
        portal.locator("#add").click()
        portal.locator('input[name="url"]').fill("https://hooks.example.com/framed")
        portal.locator("#save").click()  # a form posted from inside the frame
        expect(portal.locator("#secret")).to_contain_text("whsec_")
        page.screenshot(path=artifacts / "portal-embedded.png", full_page=True)

        # by default no site may frame it: the frame stays empty
        product.frame = _portal_link(database_url, unframed.rstrip("/"), "customer-17")
        with page.expect_response(product.frame) as framed:
            page.goto(product.origin)  # returns once the frame has loaded, or failed to
        assert framed.value.status == 200  # served, and refused by the browser
        assert "frame-ancestors 'none'" in framed.value.headers["content-security-policy"]
        (frame,) = page.main_frame.child_frames
        # the browser commits its error page a moment after the response arrives
        deadline = time.monotonic() + 20
        while not frame.url.startswith("chrome-error://") and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert frame.url.startswith("chrome-error://"), frame.url
        expect(page.frame_locator("#portal").locator("#tenant")).to_have_count(0)
        page.screenshot(path=artifacts / "portal-embedding-refused.png", full_page=True)
        browser.close()
    ((count,),) = Db(database_url).query("SELECT count(*) FROM outbox.endpoints")
    assert count == 1
