"""The operator dashboard under attack, over real connections to 127.0.0.1: sealed
secrets with and without their key, sign-in guesses sent together, connections
that never finish their headers, values no page can take, and tables of a size
no page can show whole."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from yarl import URL

from dispatchers.ui.limits import ENDPOINTS_PAGE, SIGN_IN_ATTEMPTS, TABLE_ROWS, Limits
from outbox.endpoints import Endpoints
from outbox.sealing import Keyring, generate_key
from outbox.secrets import fingerprint
from tests.dashboard import Ui, running
from tests.database import Db

pytestmark = pytest.mark.timeout(120)

SECRET = "whsec_" + "B" * 44

PAGE_BOUND = 300 * 1024
"""The most any listing page may weigh, whatever the tables hold."""


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


async def _eventually(check: Callable[[], Awaitable[bool]], *, seconds: float = 30) -> None:
    """Wait for ``check`` to hold, for at most ``seconds``; fail loudly if it never does."""
    pause = 0.05
    async with asyncio.timeout(seconds):
        for _ in range(int(seconds / pause) + 1):
            if await check():
                return
            await asyncio.sleep(pause)
    raise AssertionError(f"still not so after {seconds} s")


# -- sealed secrets ------------------------------------------------------------------


def _sealed_endpoint(db: Db, keyring: Keyring) -> int:
    with db.tx() as conn:
        return Endpoints(keyring=keyring).add(conn, url="https://e.com/", secret=SECRET).id


async def test_with_the_key_sealed_secrets_show_and_the_endpoint_is_edited_and_rotated(
    db: Db,
) -> None:
    keyring = Keyring.from_text(generate_key(), "test key")
    endpoint = _sealed_endpoint(db, keyring)
    async with running(db.url, keyring=keyring) as ui:
        listed, listing = await ui.get("/endpoints")
        shown, page = await ui.get(f"/endpoints/{endpoint}")
        csrf = await ui.csrf(f"/endpoints/{endpoint}")
        form = {"csrf": csrf, "event_types": "order.created", "cap": "2"}
        edited, _ = await ui.post(f"/endpoints/{endpoint}/edit", form)
        rotated, answer = await ui.post(
            f"/endpoints/{endpoint}/rotate-secret", {"csrf": csrf, "confirm": "rotate"}
        )
    assert (listed, shown, edited, rotated) == (200, 200, 303, 200)
    assert fingerprint(SECRET) in listing and fingerprint(SECRET) in page
    assert SECRET not in listing and SECRET not in page
    match = re.search(r'<pre id="secret">(whsec_[A-Za-z0-9+/=]+)</pre>', answer)
    assert match is not None
    ((stored, kid),) = db.query(
        "SELECT secret, key_id FROM outbox.endpoint_secrets WHERE endpoint_id = %s"
        " AND expires_at IS NULL",
        endpoint,
    )
    assert kid == keyring.current and match[1] not in stored  # the new one sealed too
    with db.tx() as conn:
        saved = Endpoints(keyring=keyring).require(conn, endpoint)
    assert saved.event_types == ["order.created"] and saved.max_concurrency == 2


async def test_without_the_key_pages_show_sealed_secrets_and_changes_that_need_it_say_so(
    db: Db,
) -> None:
    keyring = Keyring.from_text(generate_key(), "test key")
    endpoint = _sealed_endpoint(db, keyring)
    plain = db.endpoint(secret=SECRET)  # a plain one beside it: no rotation in plain text
    async with running(db.url) as ui:
        listed, listing = await ui.get("/endpoints")
        shown, page = await ui.get(f"/endpoints/{endpoint}")
        overview, _ = await ui.get("/")
        csrf = await ui.csrf(f"/endpoints/{endpoint}")
        rotated, refusal = await ui.post(
            f"/endpoints/{endpoint}/rotate-secret", {"csrf": csrf, "confirm": "rotate"}
        )
        rotated_plain, plain_refusal = await ui.post(
            f"/endpoints/{plain}/rotate-secret", {"csrf": csrf, "confirm": "rotate"}
        )
        form = {"csrf": csrf, "event_types": "order.created", "cap": ""}
        edited, edit_refusal = await ui.post(f"/endpoints/{endpoint}/edit", form)
        disabled, _ = await ui.post(f"/endpoints/{endpoint}/disable", {"csrf": csrf})
    assert (listed, shown, overview) == (200, 200, 200)
    kid = keyring.current
    assert f"sealed ({kid}): unavailable" in listing and f"sealed ({kid}): unavailable" in page
    assert fingerprint(SECRET) in listing  # the plain one's
    assert rotated == 409 and "--secrets-key-file" in refusal and "plain text" in refusal
    assert rotated_plain == 409 and "plain text" in plain_refusal
    assert edited == 409 and "--secrets-key-file" in edit_refusal and kid in edit_refusal
    assert disabled == 303  # needs no secret
    assert db.query("SELECT count(*) FROM outbox.endpoint_secrets") == [(2,)]


# -- sign-in -------------------------------------------------------------------------


async def _login_headers(ui: Ui, body: bytes) -> tuple[asyncio.StreamReader, Any]:
    """A connection that sent a sign-in's headers, asking to continue, and was
    told to: the server routed it and ran its handler up to reading the form."""
    url = URL(ui.url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(
        b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Expect: 100-continue\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 100"), head
    return reader, writer


async def _status(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1])


async def test_sign_ins_sent_together_are_judged_no_more_than_the_limit(db: Db) -> None:
    count = 50
    wrong = [f"token=guess-{i}".encode() for i in range(count - 1)]
    right = b"token=s3cret-token"
    async with running(db.url, token="s3cret-token") as ui:
        async with asyncio.timeout(60):
            # every wrong guess waits for its body at once, then the right token
            # arrives: all are in flight before any body is sent
            guesses = await asyncio.gather(*(_login_headers(ui, body) for body in wrong))
            last = await _login_headers(ui, right)
            connections = [*guesses, last]
            for (_, writer), body in zip(connections, [*wrong, right], strict=True):
                writer.write(body)
            statuses = await asyncio.gather(*(_status(reader) for reader, _ in connections))
            for _, writer in connections:
                writer.close()
        later, page = await ui.post("/login", {"token": "s3cret-token"})
    judged = [s for s in statuses if s != 429]
    assert len(judged) <= SIGN_IN_ATTEMPTS and set(judged) <= {403}
    assert statuses.count(429) >= count - SIGN_IN_ATTEMPTS
    assert statuses[-1] == 429  # the right token too, after the limit
    assert later == 429 and "Too many wrong tokens" in page


# -- connections ---------------------------------------------------------------------


@pytest.mark.slow
async def test_connections_that_never_finish_their_headers_are_capped_and_closed(
    db: Db, capfd: pytest.CaptureFixture[str]
) -> None:
    cap, holders = 20, 80
    limits = Limits(max_connections=cap, header_timeout=1.0, body_timeout=1.0)
    async with running(db.url, limits=limits) as ui:
        url = URL(ui.url)
        opened = []
        for _ in range(holders):
            reader, writer = await asyncio.open_connection(url.host, url.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            opened.append((reader, writer))

        async def answer(reader: asyncio.StreamReader) -> bytes:
            try:
                return await reader.read()  # until the server closes it
            except ConnectionResetError:  # refused before its header was read
                return b"reset"

        async with asyncio.timeout(60):
            answers = await asyncio.gather(*(answer(r) for r, _ in opened))
        for _, writer in opened:
            writer.close()
        refused = [a for a in answers if a.startswith((b"HTTP/1.1 503", b"reset"))]
        # the cap refused the rest at once; the header deadline closed those held
        assert len(refused) >= holders - cap
        assert len([a for a in answers if a == b""]) <= cap
        assert len(refused) + answers.count(b"") == holders

        async def served() -> bool:
            try:
                status, _ = await ui.get("/")
            except (OSError, aiohttp.ClientError):
                return False
            return status == 200

        await _eventually(served)

        # a form that never arrives is answered 408, not waited for
        reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n\r\ntoken="
        )
        async with asyncio.timeout(30):
            slow_form = await _status(reader)
        writer.close()
        events = ui.events("ui_connections_refused")
    assert slow_form == 408
    assert 1 <= len(events) <= 2 and sum(e["times"] for e in events) <= len(refused)
    err = capfd.readouterr().err
    assert len(err) < 2000, err[:2000]


# -- values no page can take -------------------------------------------------------

NUL = "a\x00b"

GET_FIELDS: list[tuple[str, dict[str, str], list[str]]] = [
    (
        "/messages",
        {},
        ["id", "key", "event_type", "endpoint", "state", "webhook_id", "from", "until"],
    ),
    ("/dead", {}, ["endpoint", "event_type", "since"]),
    ("/dead/confirm", {"action": "purge"}, ["endpoint", "event_type", "since", "action"]),
    ("/endpoints", {}, ["after", "attention"]),
]

POST_FIELDS: list[tuple[str, list[str]]] = [
    ("/endpoints/{endpoint}/disable", ["reason"]),
    ("/endpoints/{endpoint}/edit", ["event_types", "cap"]),
    ("/endpoints/{endpoint}/replay", ["since"]),
    ("/dead/purge", ["endpoint", "event_type", "since"]),
    ("/dead/retry", ["endpoint", "event_type", "since"]),
]

OUT_OF_RANGE = ("0001-01-01T00:00:00+23:59", "9999-12-31T23:59:00-23:59")


async def test_a_nul_or_a_time_out_of_range_in_any_field_is_a_400_naming_it(db: Db) -> None:
    endpoint = db.endpoint()
    message = db.enqueue("k")
    db.kill(message)
    async with running(db.url) as ui:
        answers: list[tuple[str, str, int, str]] = []
        for path, base, names in GET_FIELDS:
            for name in names:
                status, page = await ui.get(path, params={**base, name: NUL})
                answers.append((path, name, status, page))
        for path, names in POST_FIELDS:
            path = path.format(endpoint=endpoint)
            csrf = await ui.csrf(f"/endpoints/{endpoint}")
            for name in names:
                status, page = await ui.post(path, {"csrf": csrf, "since": "1h", name: NUL})
                answers.append((path, name, status, page))
        for value in OUT_OF_RANGE:
            for path, base, name in (
                ("/dead", {}, "since"),
                ("/dead/confirm", {"action": "purge"}, "since"),
                ("/messages", {}, "from"),
                ("/messages", {}, "until"),
            ):
                status, page = await ui.get(path, params={**base, name: value})
                answers.append((path, name, status, page))
        for path in ("/messages/%00", "/endpoints/%00"):
            status, page = await ui.get(path)
            answers.append((path, "id", status, page))
        # the guard's own fields: a CSRF token or a cookie with any character
        wrong_csrf, _ = await ui.post(f"/endpoints/{endpoint}/disable", {"csrf": "\u00e9\x00"})
        strange_cookie, _ = await ui.get("/", headers={"Cookie": "outbox_ui=x.\u00e9"})
        events = ui.events("ui_bad_value")
    for path, name, status, page in answers:
        assert status == 400, (path, name, status)
        assert f"{name}:" in page, (path, name)
    assert wrong_csrf == 403 and strange_cookie == 200
    assert events == []  # every one refused by its field, none by the database
    assert db.query("SELECT state FROM outbox.messages WHERE id = %s", message) == [("dead",)]
    assert db.query("SELECT enabled FROM outbox.endpoints") == [(True,)]


async def test_a_nul_in_a_token_is_a_wrong_token(db: Db) -> None:
    async with running(db.url, token="s3cret-token") as ui:
        status, page = await ui.post("/login", {"token": "s3cret\x00token\u00e9"})
    assert status == 403 and "not the token" in page


# -- sizes ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_every_listing_stays_small_and_the_endpoints_list_pages_through_them_all(
    db: Db,
) -> None:
    many = 20_000
    db.query(
        "INSERT INTO outbox.endpoints (url, description, enabled, disabled_reason, disabled_at)"
        " SELECT 'https://e' || g || '.example/hooks', repeat('d', 200), false,"
        "        repeat('r', 2000), now()"
        " FROM generate_series(1, %s) AS g",
        many,
    )
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, reason)"
        " SELECT 'https://h' || g || '.example:443', 'held', now() + interval '1 hour',"
        "        repeat('x', 2000)"
        " FROM generate_series(1, 5000) AS g"
    )
    ids = [row[0] for row in db.query("SELECT id FROM outbox.endpoints ORDER BY id")]
    async with running(db.url) as ui:
        sizes: dict[str, int] = {}
        status, overview = await ui.get("/")
        sizes["/"] = len(overview.encode())
        assert status == 200
        assert f"The first {TABLE_ROWS} of {many}" in overview
        assert 'href="/endpoints?attention=1"' in overview
        for path in ("/messages", "/dead", "/endpoints?attention=1", f"/endpoints/{ids[-1]}"):
            status, page = await ui.get(path)
            assert status == 200, path
            sizes[path] = len(page.encode())
        seen: list[int] = []
        path: str | None = "/endpoints"
        for _ in range(many // ENDPOINTS_PAGE + 2):
            if path is None:
                break
            status, page = await ui.get(path)
            assert status == 200, path
            sizes.setdefault("/endpoints", 0)
            sizes["/endpoints"] = max(sizes["/endpoints"], len(page.encode()))
            seen.extend(int(i) for i in re.findall(r'<tr id="endpoint-(\d+)">', page))
            following = re.search(r'href="(/endpoints\?[^"]+)" id="next-page"', page)
            path = following[1].replace("&amp;", "&") if following else None
        assert path is None, "the pages did not end"
    assert seen == ids
    assert max(sizes.values()) < PAGE_BOUND, sizes
