"""The operator dashboard in a real browser: Playwright driving the system's
Chromium against a running ``outbox ui`` and a real database.

Skipped, saying why, where Chromium or Playwright is missing (Debian:
``apt-get install chromium``; ``.ci/run`` installs it when apt-get is available).
Screenshots of each page go to ``$OUTBOX_TEST_ARTIFACTS`` when set, else to the
test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.dashboard import HOSTILE, serving
from tests.database import Db

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium; .ci/run "
            "installs it when apt-get is available)"
        )
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    return binary


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    configured = os.environ.get("OUTBOX_TEST_ARTIFACTS")
    path = Path(configured) if configured else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.slow
def test_an_operator_finds_a_dead_message_retries_it_and_no_hostile_value_runs(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = Db(database_url)
    endpoint = db.endpoint(event_types=["order.created"], description="Acme orders")
    for i in range(5):
        db.enqueue(f"waiting-{i}")
    dead = db.enqueue("order-42", headers={"X-Tenant": "acme"})
    db.kill(dead, attempts=3)
    hostile = db.enqueue(
        HOSTILE, url="https://example.com/x?q=" + HOSTILE, headers={"X-Note": HOSTILE}
    )
    db.kill(hostile, error=HOSTILE)

    command = ["ui", "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))

        page.goto(url)
        expect(page.locator('[data-state="ready"]')).to_have_text("5")
        expect(page.locator('[data-state="dead"]')).to_have_text("2")
        page.screenshot(path=artifacts / "overview.png", full_page=True)
        db.enqueue("arrives-later")  # the page shows it without a reload
        expect(page.locator('[data-state="ready"]')).to_have_text("6", timeout=20_000)

        page.get_by_role("link", name="Messages").click()
        page.fill('input[name="id"]', str(dead))
        page.get_by_role("button", name="Find").click()
        expect(page.locator("#state")).to_have_text("dead")
        expect(page.locator(".timeline li")).to_have_count(3)
        expect(page.get_by_text("X-Tenant: hidden")).to_be_visible()
        page.screenshot(path=artifacts / "message.png", full_page=True)

        page.locator("#retry").click()
        expect(page.locator("#state")).to_have_text("ready")
        expect(page.locator("#notice")).to_have_text("Sent again: it is ready for the next claim.")
        assert db.query("SELECT state FROM outbox.messages WHERE id = %s", dead) == [("ready",)]

        page.get_by_role("link", name="Dead letters").click()
        expect(page.locator("tbody tr")).to_have_count(1)
        page.screenshot(path=artifacts / "dead.png", full_page=True)
        page.goto(f"{url}messages/{hostile}")
        page.locator("#reveal").click()
        expect(page.get_by_text(f"X-Note: {HOSTILE}")).to_be_visible()
        page.screenshot(path=artifacts / "hostile.png", full_page=True)
        page.get_by_role("link", name="Endpoints").click()
        expect(page.get_by_text("Acme orders")).to_be_visible()
        page.screenshot(path=artifacts / "endpoints.png", full_page=True)

        page.get_by_role("link", name=str(endpoint), exact=True).click()
        expect(page.locator("#in-flight")).to_have_text("0 of no cap")
        page.screenshot(path=artifacts / "endpoint.png", full_page=True)
        page.locator("#rotate").click()
        expect(page.locator("#confirm-rotate")).to_be_visible()
        page.screenshot(path=artifacts / "rotate-confirm.png", full_page=True)
        assert db.query("SELECT count(*) FROM outbox.endpoint_secrets") == [(1,)]  # not yet
        page.locator("#confirm-rotate").click()
        secret = page.locator("#secret").inner_text()
        assert secret.startswith("whsec_")
        page.screenshot(path=artifacts / "rotated.png", full_page=True)
        page.get_by_role("link", name=f"Back to endpoint {endpoint}").click()
        expect(page.locator("#rotate")).to_be_visible()
        assert secret not in page.content()  # shown once, on the answer only
        browser.close()

    assert dialogs == []
    assert [r for r in requests if not r.startswith(url)] == []


@pytest.mark.slow
def test_read_only_pages_offer_no_action(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = Db(database_url)
    endpoint = db.endpoint(description="Acme orders")
    dead = db.enqueue("order-42")
    db.kill(dead, attempts=2)

    command = ["ui", "--read-only", "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        for path in ("", f"messages/{dead}", "dead", "endpoints", f"endpoints/{endpoint}"):
            page.goto(url + path)
            expect(page.locator(".badge")).to_have_text("read-only")
            expect(page.locator("main form[method=post]")).to_have_count(0)
            actions = page.locator("#retry, #reveal, #rotate, #replay, #save, .danger")
            expect(actions).to_have_count(0)
        expect(page.locator("#attempts")).to_have_text("0")
        page.screenshot(path=artifacts / "read-only-endpoint.png", full_page=True)
        browser.close()


@pytest.mark.slow
def test_sealed_secrets_walk_the_endpoint_pages_with_the_key_and_refuse_rotation_without(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from outbox.endpoints import Endpoints
    from outbox.sealing import Keyring, generate_key
    from outbox.secrets import fingerprint

    key = generate_key()
    keyring = Keyring.from_text(key, "test key")
    secret = "whsec_" + "D" * 44
    db = Db(database_url)
    with db.tx() as conn:
        endpoint = Endpoints(keyring=keyring).add(conn, url="https://e.com/", secret=secret).id
    keys = tmp_path / "keys"
    keys.write_text(key + "\n")
    command = ["ui", "--port", "0", "--database-url", database_url]

    with (
        serving([*command, "--secrets-key-file", str(keys)], tmp_path / "ui.log") as url,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        page.goto(url + "endpoints")
        expect(page.get_by_text(fingerprint(secret))).to_be_visible()
        page.get_by_role("link", name=str(endpoint), exact=True).click()
        expect(page.locator("#secrets")).to_contain_text(fingerprint(secret))
        page.fill('textarea[name="event_types"]', "order.created")
        page.locator("#save").click()
        expect(page.get_by_text("Saved.")).to_be_visible()
        page.locator("#rotate").click()
        page.locator("#confirm-rotate").click()
        rotated = page.locator("#secret").inner_text()
        assert rotated.startswith("whsec_")
        page.get_by_role("link", name=f"Back to endpoint {endpoint}").click()
        expect(page.locator("#secrets")).to_contain_text(fingerprint(rotated))
        page.screenshot(path=artifacts / "sealed-endpoint.png", full_page=True)
        browser.close()

    env = {"OUTBOX_SECRETS_KEY": ""}
    with (
        serving(command, tmp_path / "keyless.log", env=env) as url,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        page.goto(url + "endpoints")
        expect(page.get_by_text(f"sealed ({keyring.current}): unavailable").first).to_be_visible()
        page.goto(f"{url}endpoints/{endpoint}")
        expect(page.locator("#secrets")).to_contain_text("was not given")
        page.locator("#rotate").click()
        page.locator("#confirm-rotate").click()
        expect(page.get_by_text("--secrets-key-file")).to_be_visible()
        page.screenshot(path=artifacts / "sealed-without-key.png", full_page=True)
        browser.close()


_OVERFLOW = """() => {
  const width = window.innerWidth;
  const header = document.querySelector("header").getBoundingClientRect();
  const outside = [...document.querySelectorAll("header *")]
    .map((e) => [e.id || e.className || e.tagName, e.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && (r.right > header.right + 0.5 || r.left < header.left - 0.5
      || r.bottom > header.bottom + 0.5 || r.top < header.top - 0.5))
    .map(([name]) => String(name));
  const wide = [...document.querySelectorAll("main *")]
    .filter((e) => !e.closest(".scroll") && e.getBoundingClientRect().right > width + 0.5)
    .map((e) => e.tagName + "." + e.className);
  return {scroll: document.documentElement.scrollWidth, width, outside, wide};
}"""


@pytest.mark.slow
def test_at_420_pixels_wide_nothing_spills_out_of_the_page_or_the_header(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = Db(database_url)
    long_url = "https://hooks.example.com/" + "/".join(f"segment-{i}" for i in range(30))
    endpoint = db.endpoint(url=long_url, event_types=["order.created"], description="Acme")
    db.publish("order.created", "e1")
    dead = db.enqueue("order-42", url=long_url + "?q=" + "x" * 200)
    db.kill(dead, attempts=2, error="HTTP 500 " + "y" * 400)
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
        " VALUES (%s, 'open', now() + interval '1 minute', now()) RETURNING 1",
        f"endpoint:{endpoint}",
    )
    command = ["ui", "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 420, "height": 900})
        page.set_default_timeout(20_000)
        paths = {
            "overview": "",
            "messages": "messages",
            "message": f"messages/{dead}",
            "dead": "dead",
            "endpoints": "endpoints",
            "endpoint": f"endpoints/{endpoint}",
        }
        for name, path in paths.items():
            page.goto(url + path)
            expect(page.locator("#times")).to_be_visible()
            measured = page.evaluate(_OVERFLOW)
            assert measured["scroll"] <= measured["width"], (name, measured)
            assert measured["outside"] == [], (name, measured)
            assert measured["wide"] == [], (name, measured)
            page.screenshot(path=artifacts / f"narrow-{name}.png", full_page=True)
        # a long URL in a table keeps one line, cut, with the whole of it in its title
        page.goto(url + "dead")
        cell = page.locator("td.url > span").first
        assert cell.get_attribute("title") == long_url + "?q=" + "x" * 200
        box = cell.bounding_box()
        assert box is not None and box["height"] < 30
        # no cell squeezed to a character a line: the row stays a few lines high
        row = page.locator("tbody tr").first.bounding_box()
        assert row is not None and row["height"] < 200, row
        # the table scrolls in its own box
        scroller = page.locator(".scroll").first
        assert scroller.evaluate("e => e.scrollWidth > e.clientWidth")
        browser.close()


@pytest.mark.slow
def test_times_switch_to_the_browsers_zone_and_back_keeping_the_other_in_the_title(
    database_url: str, chromium: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = Db(database_url)
    dead = db.enqueue("order-42")
    db.kill(dead, attempts=1)
    db.query("UPDATE outbox.messages SET created_at = '2026-01-15T12:00:00Z' WHERE id = %s", dead)
    command = ["ui", "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        context = browser.new_context(timezone_id="Asia/Kolkata")  # UTC+05:30, all year
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(f"{url}messages/{dead}")
        created = page.locator("dd time").nth(1)
        expect(created).to_have_text("2026-01-15 12:00:00Z")
        expect(created).to_have_attribute("title", "2026-01-15 17:30:00 +05:30 (local time)")
        page.locator("#times").click()
        expect(page.locator("#times")).to_have_text("Times: local")
        expect(created).to_have_text("2026-01-15 17:30:00 +05:30")
        expect(created).to_have_attribute("title", "2026-01-15 12:00:00Z (UTC)")
        page.reload()  # the choice is kept
        expect(page.locator("dd time").nth(1)).to_have_text("2026-01-15 17:30:00 +05:30")
        # and applies to what the overview's refresh swaps in
        page.goto(url)
        as_of = page.locator("main > p.muted time").first
        expect(as_of).to_contain_text("+05:30")
        first = as_of.get_attribute("datetime")
        assert first is not None
        expect(as_of).not_to_have_attribute("datetime", first, timeout=20_000)
        expect(as_of).to_contain_text("+05:30")
        page.goto(f"{url}messages/{dead}")
        page.locator("#times").click()
        expect(page.locator("dd time").nth(1)).to_have_text("2026-01-15 12:00:00Z")
        browser.close()


@pytest.mark.slow
def test_an_operator_cancels_a_message_acts_on_ticked_dead_letters_and_manages_an_endpoint(
    database_url: str, chromium: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    db = Db(database_url)
    waiting = db.enqueue("waiting")
    dead = [db.enqueue(f"dead-{i}") for i in range(3)]
    for message in dead:
        db.kill(message, attempts=1)

    command = ["ui", "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)

        page.goto(f"{url}messages/{waiting}")
        page.locator("#cancel").click()
        expect(page.locator("#state")).to_have_text("dead")
        expect(page.locator("#notice")).to_contain_text("Cancelled")

        page.goto(url + "dead")
        page.get_by_label(f"select message {dead[0]}").check()
        page.get_by_label(f"select message {dead[2]}").check()
        page.locator("#purge-selected").click()
        expect(page.locator("#count")).to_have_text("2")
        page.screenshot(path=artifacts / "purge-selected.png", full_page=True)
        page.locator("#confirm").click()
        expect(page.locator(".notice")).to_have_text("Purged 2 dead message(s).")
        expect(page.locator("tbody tr")).to_have_count(2)  # dead[1] and the cancelled one

        page.get_by_role("link", name="Endpoints").click()
        page.locator("#add").click()
        page.fill('input[name="url"]', "https://hooks.example.com/orders")
        page.fill('textarea[name="event_types"]', "order.created")
        page.fill('input[name="retry_schedule"]', "5s,soon")
        page.locator("#save").click()
        expect(page.locator("#form-error")).to_contain_text("retry_schedule:")
        expect(page.locator('input[name="url"]')).to_have_value("https://hooks.example.com/orders")
        page.screenshot(path=artifacts / "endpoint-form-error.png", full_page=True)
        page.fill('input[name="retry_schedule"]', "5s,1m")
        page.locator("#save").click()
        assert page.locator("#secret").inner_text().startswith("whsec_")
        page.get_by_role("link", name="Go to endpoint").click()
        expect(page.locator('input[name="retry_schedule"]')).to_have_value("5s,1m")
        page.fill('input[name="cap"]', "3")
        page.locator("#save").click()
        expect(page.get_by_text("Saved.")).to_be_visible()
        expect(page.locator("#in-flight")).to_have_text("0 of 3")
        page.locator("#delete").click()
        page.locator("#confirm-delete").click()
        expect(page.locator("#notice")).to_contain_text("Deleted endpoint")
        browser.close()
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]
