"""Credentials a receiver echoes back never reach what an attempt records.

The receivers here answer with the request they got: every header as a line and
again as JSON with ``/`` escaped (as PHP writes it), a Basic password decoded,
or a malformed header line quoting ``Authorization``. Through a real dispatcher
and a real database, the stored excerpt holds the echo with each credential
(bearer, basic, an endpoint's static header, an OAuth2 access token, a message's
own ``Authorization``, the webhook signature) replaced and the rest as it came;
through the real sender and both HTTP clients, an error text quoting the answer,
and a proxy's answer echoing its credentials, likewise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dispatchers.delivery.http import Sender
from dispatchers.delivery.outcome import Verdict
from dispatchers.delivery.proxy import Proxy
from dispatchers.delivery.redaction import MARKER, Sent
from outbox import OAuth2ClientCredentials, Outbox
from outbox.endpoints import Endpoints
from tests.database import Db
from tests.dispatching import fast_config, running, wait_until
from tests.jobs import job
from tests.rawserver import RawServer, read_request
from tests.receiver import Received, Receiver, Reply

TOKEN = "tok/9a0e+2f7c3b1d5a86="
PASSWORD = "pw-b7e0c1f9a2d44e61"
API_KEY = 'ak-3f9c"1d7e\\55a0b2c4'  # escaped in JSON: ak-3f9c\"1d7e\\55a0b2c4
ACCESS_TOKEN = "oa2/c0ffee.5eed+d00d"
CLIENT_SECRET = "cs-1c2d3e4f5a6b7c8d"
OWN = "Digest response=6629fae49393a05397450978507c4ef1"
BASIC = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


def echo(path: str, headers: dict[str, str], basic: tuple[str, str] | None = None) -> str:
    """What the receiver answers: the request's headers as lines, the user and
    password of Basic authentication (``basic``, else decoded from ``headers``),
    and the headers as JSON with ``/`` escaped."""
    lines = [f"denied {path}"]
    lines += [f"{name}: {value}" for name, value in sorted(headers.items())]
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if basic is None and scheme == "Basic":
        user, _, password = base64.b64decode(credentials).decode().partition(":")
        basic = (user, password)
    if basic is not None:
        lines.append(f"user {basic[0]} password {basic[1]}")
    lines.append(json.dumps(headers, sort_keys=True).replace("/", "\\/"))
    return "\n".join(lines)


def echoing(request: Received) -> Reply:
    """The token endpoint at ``/token``; anything else is refused with its echo."""
    if request.path == "/token":
        document = {"access_token": ACCESS_TOKEN, "token_type": "Bearer", "expires_in": 3600}
        return Reply(200, {"Content-Type": "application/json"}, json.dumps(document).encode())
    return Reply(400, body=echo(request.path, request.headers).encode())


@pytest.fixture
def echoing_receiver() -> Iterator[Receiver]:
    with Receiver(echoing) as receiver:
        yield receiver


def endpoint(db: Db, **credentials: Any) -> None:
    with db.tx() as conn:
        Endpoints().add(conn, **credentials)
        Outbox().publish(conn, "order.paid", {"n": 1})


def plain_message(db: Db, url: str) -> None:
    with db.tx() as conn:
        Outbox().enqueue(
            conn, url=url, idempotency_key="p", json={}, headers={"Authorization": OWN}
        )


Setup = Callable[[Db, str], None]
CASES: dict[str, tuple[Setup, dict[str, str], tuple[str, ...]]] = {
    # what to deliver; each echoed header's value as it must be stored (the
    # others as sent); the credentials in every form the receiver wrote them
    "bearer": (
        lambda db, url: endpoint(db, url=f"{url}/bearer", bearer_token=TOKEN),
        {"authorization": f"Bearer {MARKER}"},
        (TOKEN, TOKEN.replace("/", "\\/")),
    ),
    "basic": (
        lambda db, url: endpoint(db, url=f"{url}/basic", basic_auth=("alice", PASSWORD)),
        {"authorization": f"Basic {MARKER}"},
        (BASIC, BASIC.replace("/", "\\/"), PASSWORD),
    ),
    "static header": (
        lambda db, url: endpoint(db, url=f"{url}/header", headers={"X-Api-Key": API_KEY}),
        {"x-api-key": MARKER},
        (API_KEY, json.dumps(API_KEY)[1:-1]),
    ),
    "oauth2": (
        lambda db, url: endpoint(
            db,
            url=f"{url}/oauth2",
            oauth2=OAuth2ClientCredentials(f"{url}/token", "outbox-client", CLIENT_SECRET),
        ),
        {"authorization": f"Bearer {MARKER}"},
        (ACCESS_TOKEN, ACCESS_TOKEN.replace("/", "\\/"), CLIENT_SECRET),
    ),
    "a plain message's own authorization": (
        plain_message,
        {"authorization": f"Digest {MARKER}"},
        (OWN, OWN.partition(" ")[2]),
    ),
}


@pytest.mark.parametrize("case", CASES)
async def test_credentials_a_receiver_echoes_are_replaced_in_the_stored_excerpt(
    database_url: str, echoing_receiver: Receiver, case: str
) -> None:
    receiver = echoing_receiver
    db = Db(database_url)
    setup, stored_as, forms = CASES[case]
    setup(db, receiver.url)
    async with running(db, fast_config(excerpt_bytes=8192)):
        await wait_until(lambda: db.query("SELECT count(*) FROM outbox.attempts") == [(1,)])
    ((excerpt, error, status),) = db.query(
        "SELECT response_excerpt, error, status FROM outbox.attempts"
    )
    (request,) = [r for r in receiver.requests if r.path != "/token"]
    webhook = "webhook-signature" in request.headers
    expected = {**request.headers, **stored_as}
    if webhook:  # one secret: one signature
        expected["webhook-signature"] = f"v1,{MARKER}"
    answer = echo(request.path, expected, ("alice", MARKER) if case == "basic" else None)
    assert status == 400 and error == "HTTP 400 Bad Request"
    assert excerpt == answer  # all the rest as the receiver wrote it
    assert excerpt != echo(request.path, request.headers)
    for form in forms:
        assert form not in excerpt
    if webhook:
        signature = request.headers["webhook-signature"].partition(",")[2]
        assert signature not in excerpt and signature.replace("/", "\\/") not in excerpt
        assert f"webhook-id: {request.headers['webhook-id']}" in excerpt
    assert f"idempotency-key: {request.headers['idempotency-key']}" in excerpt
    if case == "basic":
        assert f"user alice password {MARKER}" in excerpt


# -- error texts and proxies, through the sender and both clients -----------------------

LONG_TOKEN = "Zq" + "7e1c0a9b" * 80  # longer than an error text: cut inside it


def quoting_authorization(conn: socket.socket, closed: threading.Event) -> None:
    """Answer with a malformed header line: the request's ``Authorization``."""
    head = read_request(conn)
    (line,) = [h for h in head.split(b"\r\n") if h.lower().startswith(b"authorization:")]
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + line.partition(b":")[2].strip() + b"\r\n\r\n")


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
async def test_an_error_text_quoting_the_answer_holds_no_credential_even_cut_short(
    http_client: str,
) -> None:
    sender = Sender(fast_config(http_client=http_client))
    try:
        with RawServer(quoting_authorization) as raw:
            message = job(url=raw.url(), auth_headers={"Authorization": f"Bearer {LONG_TOKEN}"})
            async with asyncio.timeout(10):
                attempt = await sender.send(message)
    finally:
        await sender.aclose()
    outcome = attempt.outcome
    assert outcome.error_class == "protocol_error" and outcome.error is not None
    assert outcome.error.endswith(f"Bearer {MARKER}...")
    assert LONG_TOKEN[:4] not in outcome.error


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
async def test_a_proxy_that_echoes_its_credentials_leaves_none_in_the_excerpt(
    http_client: str,
) -> None:
    with Receiver(
        lambda request: Reply(502, body=echo(request.path, request.headers).encode())
    ) as proxy:
        port = proxy.url.rpartition(":")[2]
        config = fast_config(
            http_client=http_client, proxy=Proxy.parse(f"http://carol:{PASSWORD}@127.0.0.1:{port}")
        )
        sender = Sender(config)
        try:
            async with asyncio.timeout(10):
                attempt = await sender.send(job(url="http://127.0.0.1:9/hook"))
        finally:
            await sender.aclose()
    (request,) = proxy.requests
    sent = request.headers["proxy-authorization"]
    assert sent == "Basic " + base64.b64encode(f"carol:{PASSWORD}".encode()).decode()
    assert attempt.outcome.verdict is Verdict.RETRY and attempt.excerpt is not None
    assert attempt.excerpt == echo(
        request.path, {**request.headers, "proxy-authorization": f"Basic {MARKER}"}
    )
    assert sent.partition(" ")[2] not in attempt.excerpt and PASSWORD not in attempt.excerpt


# -- the forms looked for, pure ---------------------------------------------------------


def test_a_credential_is_found_raw_json_escaped_percent_encoded_and_html_escaped() -> None:
    value = 'k/y+"<&>"=='
    sent = Sent({"X-Api-Key": value})
    for form in (
        value,
        json.dumps(value)[1:-1],
        json.dumps(value)[1:-1].replace("/", "\\/"),
        "k%2Fy%2B%22%3C%26%3E%22%3D%3D",
        "k/y+&quot;&lt;&amp;&gt;&quot;==",
    ):
        assert sent.redact(f"got ({form}) from you") == f"got ({MARKER}) from you"


def test_a_tail_cut_inside_a_credential_is_replaced_only_when_the_text_was_cut() -> None:
    sent = Sent({"Authorization": "Bearer abcdefgh12345"})
    assert sent.redact("you sent Bearer abcdef", cut=True) == f"you sent Bearer {MARKER}"
    assert sent.redact("you sent Bearer abcdef") == "you sent Bearer abcdef"
    assert sent.redact("you sent abc", cut=True) == "you sent abc"  # too short to tell


def test_which_headers_hold_credentials() -> None:
    sent = Sent(
        {
            "X-Team": "team-a",  # the endpoint's own: a credential, whatever its name
            "X-Short": "ab",  # too short to look for
            "X-Auth-Token": "message-token-1",  # a message's, named like a credential
            "Cookie": "sid=31d4d96e",
            "X-Tenant": "acme-corp",
            "Idempotency-Key": '"order-7"',
        },
        own=["x-team", "X-Short"],
    )
    text = "team-a ab message-token-1 sid=31d4d96e acme-corp order-7"
    assert sent.redact(text) == f"{MARKER} ab {MARKER} {MARKER} acme-corp order-7"


def test_an_error_text_stays_within_its_bound_once_redacted() -> None:
    sent = Sent({"Authorization": "Bearer abcd"})
    error = "wxyz " + "abcd " * 98 + "ab..."
    assert len(error) == 500
    redacted = sent.redact_error(error, limit=500)
    assert redacted is not None and len(redacted) <= 500 and "abcd" not in redacted
    assert redacted.endswith("...")
