"""Deliveries to endpoints with OAuth2 client credentials, against a real token
server and a real receiver on 127.0.0.1, through the real sender and its guarded
clients.

The token server checks the client's Basic authentication (against the clients it
knows) and form, counts its fetches and issues ``tok-1``, ``tok-2``... with the
``expires_in`` it is told, at ``/token`` and ``/rotated/token`` alike; the
receiver accepts the bearer tokens the test says are valid and answers 401 to
any other.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote_plus

import pytest
from aiohttp import web

from dispatchers.delivery.auth import ClientCredentials
from dispatchers.delivery.health import is_counted, is_failure
from dispatchers.delivery.http import Attempt, Sender
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.outcome import Verdict
from outbox import OAuth2ClientCredentials, Outbox
from outbox.endpoints import Endpoints
from outbox.sealing import Keyring, generate_key
from outbox.secrets import generate_secret
from tests.database import Db
from tests.dispatching import fast_config, running, wait_until
from tests.jobs import job as make_job
from tests.rawserver import RawServer
from tests.receiver import Received, Receiver, Reply
from tests.waiting import until

CLIENT_ID = "dispatcher 1:a"
SECRET = "s3cr3t+/=&ü"
ROTATED_SECRET = "r0tated+/=&ü"
OTHER_CLIENT_ID = "dispatcher 2"

SIGNING = generate_secret()

GUARDED = {
    "allow_private_networks": False,
    "allow_networks": ("127.0.0.1/32",),
    "request_timeout": 5.0,
    "connect_timeout": 1.0,
    "lease": 30.0,
    "excerpt_bytes": 64,
}
"""The SSRF guard on, admitting 127.0.0.1 (the servers' address) alone; time for
64 concurrent requests to a threaded receiver; excerpts shorter than a token."""


@dataclass
class TokenServer:
    """An OAuth2 token endpoint (client credentials) on 127.0.0.1."""

    expires_in: object = 3600
    """Sent as is; None: left out."""
    token_length: int = 2000
    """Issued tokens are padded to this length, as a JWT is long."""
    reply: tuple[int, bytes] | None = None
    """Answer this instead of a token, when set."""
    held: asyncio.Event | None = None
    """Answer once this is set, when there is one."""
    clients: set[tuple[str, str]] = field(default_factory=lambda: {(CLIENT_ID, SECRET)})
    """The (client id, secret) pairs it issues tokens to."""
    fetches: int = 0
    fetched_at: list[float] = field(default_factory=list)
    forms: list[dict[str, list[str]]] = field(default_factory=list)
    asked: list[tuple[str, str, str]] = field(default_factory=list)
    """The path, client id and secret of each fetch."""
    issued: list[str] = field(default_factory=list)
    url: str = ""
    rotated_url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/token", self._token)
        app.router.add_post("/rotated/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/token"
        self.rotated_url = f"http://127.0.0.1:{port}/rotated/token"

    async def stop(self) -> None:
        if self.held is not None:
            self.held.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def credentials(self, **overrides: Any) -> ClientCredentials:
        fields: dict[str, Any] = {
            "token_url": self.url,
            "client_id": CLIENT_ID,
            "client_secret": SECRET,
            "scope": "deliver",
            "audience": "https://receiver.example",
        }
        return ClientCredentials(**{**fields, **overrides})

    async def _token(self, request: web.Request) -> web.Response:
        self.fetches += 1
        self.fetched_at.append(time.monotonic())
        form = parse_qs((await request.read()).decode("ascii"), strict_parsing=True)
        self.forms.append(form)
        if self.held is not None:
            await asyncio.wait_for(self.held.wait(), 30)
        assert request.content_type == "application/x-www-form-urlencoded"
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        client_id, _, secret = base64.b64decode(encoded).decode("ascii").partition(":")
        client = (unquote_plus(client_id), unquote_plus(secret))
        self.asked.append((request.path, *client))
        if scheme != "Basic" or client not in self.clients:
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("grant_type") != ["client_credentials"]:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        if self.reply is not None:
            status, body = self.reply
            return web.Response(status=status, body=body, content_type="application/json")
        token = f"tok-{self.fetches}-".ljust(self.token_length, "x")
        self.issued.append(token)
        document: dict[str, object] = {"access_token": token, "token_type": "Bearer"}
        if self.expires_in is not None:
            document["expires_in"] = self.expires_in
        return web.json_response(document)


class BearerReceiver(Receiver):
    """A receiver that answers 200 to a request bearing a valid token, 401 to others."""

    def __init__(self) -> None:
        self.valid: set[str] = set()
        super().__init__(self._answer)

    def _answer(self, request: Received) -> Reply:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme == "Bearer" and token in self.valid:
            return Reply(200)
        return Reply(401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    def tokens(self) -> list[str]:
        return [r.headers.get("authorization", "").removeprefix("Bearer ") for r in self.requests]


@pytest.fixture
async def token_server() -> AsyncIterator[TokenServer]:
    server = TokenServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def bearer_receiver() -> Iterator[BearerReceiver]:
    receiver = BearerReceiver()
    with receiver:
        yield receiver


@pytest.fixture
async def sender(request: pytest.FixtureRequest) -> AsyncIterator[Sender]:
    """The real sender (the guarded default client), ``http_client`` per the test's
    parameter (aiohttp when it has none)."""
    client = getattr(request, "param", "aiohttp")
    sender = Sender(fast_config(GUARDED, http_client=client, concurrency=16))
    try:
        yield sender
    finally:
        await sender.aclose()


def job(url: str, credentials: ClientCredentials, **overrides: Any) -> Job:
    """A webhook of endpoint 3, signed, with ``credentials``."""
    return make_job(url=url, endpoint_id=3, secrets=(SIGNING,), oauth2=credentials, **overrides)


async def send_all(sender: Sender, jobs: list[Job]) -> list[Attempt]:
    async with asyncio.timeout(30):
        return await asyncio.gather(*(sender.send(j) for j in jobs))


def delivered(attempts: list[Attempt]) -> bool:
    return all(a.outcome.verdict is Verdict.DELIVERED for a in attempts)


# -- tokens: fetched once, shared, reused, refreshed ------------------------------------


@pytest.mark.parametrize("sender", ["aiohttp", "httpx"], indirect=True)
async def test_64_concurrent_deliveries_make_one_token_fetch(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    bearer_receiver.valid.add("tok-1-".ljust(2000, "x"))  # longer than an excerpt
    credentials = token_server.credentials()
    attempts = await send_all(sender, [job(bearer_receiver.url, credentials)] * 64)
    assert delivered(attempts)
    assert token_server.fetches == 1
    assert set(bearer_receiver.tokens()) == set(token_server.issued)
    assert len(bearer_receiver.requests) == 64
    (form,) = token_server.forms
    assert form == {
        "grant_type": ["client_credentials"],
        "scope": ["deliver"],
        "audience": ["https://receiver.example"],
    }
    attempts = await send_all(sender, [job(bearer_receiver.url, credentials)] * 8)
    assert delivered(attempts)
    assert token_server.fetches == 1  # cached


@pytest.mark.slow
async def test_a_token_is_reused_until_near_its_expiry_then_replaced(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    token_server.expires_in = 2  # replaced after 1.8 s
    token_server.token_length = 8
    bearer_receiver.valid.update({"tok-1-xx", "tok-2-xx"})
    credentials = token_server.credentials()

    async def deliver_until_cancelled() -> None:
        while True:
            (attempt,) = await send_all(sender, [job(bearer_receiver.url, credentials)])
            assert attempt.outcome.verdict is Verdict.DELIVERED

    delivering = asyncio.create_task(deliver_until_cancelled())
    try:
        await until(lambda: "tok-2-xx" in bearer_receiver.tokens(), "a second token in use")
    finally:
        delivering.cancel()
        await asyncio.gather(delivering, return_exceptions=True)
    assert token_server.fetches == 2
    first, second = token_server.fetched_at
    assert second - first >= 1.7  # 2 s less 10%, less the first request's way there
    used = bearer_receiver.tokens()
    switch = used.index("tok-2-xx")
    assert switch > 1 and set(used[:switch]) == {"tok-1-xx"}
    last_old = bearer_receiver.requests[switch - 1].at
    assert last_old < first + 2.0  # never sent expired


@pytest.mark.parametrize("field", ["token_url", "client_id", "client_secret", "scope", "audience"])
async def test_changed_credentials_never_reuse_the_old_token(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver, field: str
) -> None:
    """Each field of the client is part of the cache's key: a change of any one
    (a leaked secret rotated, say) fetches a new token, asked for as changed."""
    token_server.token_length = 8
    token_server.clients |= {(OTHER_CLIENT_ID, SECRET), (CLIENT_ID, ROTATED_SECRET)}
    bearer_receiver.valid.update({"tok-1-xx", "tok-2-xx"})
    changed = {
        "token_url": token_server.rotated_url,
        "client_id": OTHER_CLIENT_ID,
        "client_secret": ROTATED_SECRET,
        "scope": "deliver more",
        "audience": "https://other.example",
    }[field]
    await send_all(sender, [job(bearer_receiver.url, token_server.credentials())])
    after = token_server.credentials(**{field: changed})
    attempts = await send_all(sender, [job(bearer_receiver.url, after)])
    assert delivered(attempts)
    assert token_server.fetches == 2
    assert bearer_receiver.tokens() == ["tok-1-xx", "tok-2-xx"]
    path = "/rotated/token" if field == "token_url" else "/token"
    assert token_server.asked[1] == (path, after.client_id, after.client_secret)
    form = token_server.forms[1]
    assert (form["scope"], form["audience"]) == ([after.scope], [after.audience])


async def test_the_endpoint_token_replaces_an_authorization_header_of_the_message(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    token_server.token_length = 8
    bearer_receiver.valid.add("tok-1-xx")
    message = job(
        bearer_receiver.url,
        token_server.credentials(),
        headers={"authorization": "Basic bWU6cHc=", "X-Tenant": "acme"},
    )
    (attempt,) = await send_all(sender, [message])
    assert attempt.outcome.verdict is Verdict.DELIVERED
    (request,) = bearer_receiver.requests
    assert request.headers["authorization"] == "Bearer tok-1-xx"
    assert request.headers["x-tenant"] == "acme"


# -- a 401 from the receiver ------------------------------------------------------------


@pytest.mark.parametrize("sender", ["aiohttp", "httpx"], indirect=True)
@pytest.mark.slow
async def test_a_401_refreshes_the_token_once_and_the_request_is_sent_again(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    token_server.token_length = 8
    bearer_receiver.valid.add("tok-2-xx")  # tok-1 is revoked as soon as issued
    credentials = token_server.credentials()
    attempts = await send_all(sender, [job(bearer_receiver.url, credentials)] * 64)
    assert delivered(attempts)
    assert token_server.fetches == 2  # 64 refusals of tok-1, one refresh
    used = bearer_receiver.tokens()
    assert (used.count("tok-1-xx"), used.count("tok-2-xx")) == (64, 64)


async def test_a_receiver_that_always_answers_401_gets_one_refresh_per_attempt(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    token_server.token_length = 8
    (attempt,) = await send_all(sender, [job(bearer_receiver.url, token_server.credentials())])
    outcome = attempt.outcome
    assert (outcome.verdict, outcome.status, outcome.error_class) == (
        Verdict.FAILED,
        401,
        "http_401",
    )
    assert token_server.fetches == 2
    assert bearer_receiver.tokens() == ["tok-1-xx", "tok-2-xx"]


# -- no token: the attempt retries, with a clear reason -----------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ((400, b'{"error":"invalid_client","error_description":"s3cr3t"}'), "400 (invalid_client)"),
        ((503, b"<html>unavailable</html>"), "503"),
        ((200, b"{not json"), "200 without a JSON object"),
        ((200, b'{"access_token":"t","token_type":"mac"}'), "token_type 'mac', not Bearer"),
        ((200, b'{"token_type":"Bearer"}'), "no valid access_token"),
    ],
)
async def test_a_token_endpoint_answer_without_a_token_makes_the_attempt_retry(
    sender: Sender,
    token_server: TokenServer,
    bearer_receiver: BearerReceiver,
    caplog: pytest.LogCaptureFixture,
    reply: tuple[int, bytes],
    error: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    token_server.reply = reply
    attempt = await send_one(sender, job(bearer_receiver.url, token_server.credentials()))
    outcome = attempt.outcome
    assert (outcome.verdict, outcome.status, outcome.error_class) == (Verdict.RETRY, None, "oauth2")
    assert outcome.error == f"OAuth2 token endpoint {token_server.url} answered {error}"
    assert is_counted(outcome) and is_failure(outcome)  # against the destination
    assert bearer_receiver.requests == []
    assert_nothing_secret(caplog, outcome.error)


async def test_wrong_client_credentials_say_invalid_client(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    credentials = token_server.credentials(client_secret="not " + SECRET)
    attempt = await send_one(sender, job(bearer_receiver.url, credentials))
    assert attempt.outcome.error == (
        f"OAuth2 token endpoint {token_server.url} answered 401 (invalid_client)"
    )
    assert attempt.outcome.verdict is Verdict.RETRY


async def test_an_unreachable_token_endpoint_makes_the_attempt_retry(
    sender: Sender, bearer_receiver: BearerReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://127.0.0.1:{closed_port()}/token"
    credentials = ClientCredentials(url, CLIENT_ID, SECRET, None, None)
    attempt = await send_one(sender, job(bearer_receiver.url, credentials))
    outcome = attempt.outcome
    assert (outcome.verdict, outcome.error_class) == (Verdict.RETRY, "oauth2")
    assert outcome.error is not None
    assert outcome.error.startswith(f"OAuth2 token endpoint {url} unreachable: connect error")
    assert is_failure(outcome)
    assert bearer_receiver.requests == []
    assert_nothing_secret(caplog, outcome.error)


@pytest.mark.slow
async def test_a_slow_token_endpoint_ends_the_attempt_with_its_own_reason(
    token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    token_server.held = asyncio.Event()  # never set while the attempt lasts
    sender = Sender(fast_config(GUARDED, request_timeout=1.0))
    try:
        attempt = await send_one(sender, job(bearer_receiver.url, token_server.credentials()))
    finally:
        await sender.aclose()
    outcome = attempt.outcome
    assert (outcome.verdict, outcome.error_class) == (Verdict.RETRY, "oauth2")
    assert outcome.error == f"OAuth2 token endpoint {token_server.url} did not answer within 0.5 s"
    assert token_server.fetches == 1
    assert bearer_receiver.requests == []


async def test_a_failed_fetch_is_shared_by_concurrent_deliveries(
    sender: Sender, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    token_server.reply = (500, b"")
    credentials = token_server.credentials()
    attempts = await send_all(sender, [job(bearer_receiver.url, credentials)] * 64)
    assert {a.outcome.error_class for a in attempts} == {"oauth2"}
    attempts = await send_all(sender, [job(bearer_receiver.url, credentials)] * 8)
    assert {a.outcome.error_class for a in attempts} == {"oauth2"}  # held, not asked again
    assert token_server.fetches == 1


async def test_a_token_url_the_ssrf_guard_refuses_is_never_connected_to(
    bearer_receiver: BearerReceiver,
) -> None:
    config = fast_config(GUARDED, allow_networks=())  # nothing private: not 127.0.0.1
    with RawServer() as token_endpoint:
        credentials = ClientCredentials(
            token_endpoint.url(path="/token"), CLIENT_ID, SECRET, None, None
        )
        sender = Sender(config)
        try:
            attempt = await send_one(sender, job(bearer_receiver.url, credentials))
        finally:
            await sender.aclose()
        assert token_endpoint.connections == 0
    outcome = attempt.outcome
    assert (outcome.verdict, outcome.error_class) == (Verdict.BLOCKED, "blocked_destination")
    assert outcome.error is not None
    assert outcome.error.startswith(
        f"OAuth2 token endpoint {token_endpoint.url(path='/token')} refused: "
    )
    assert not is_counted(outcome)  # a setting of the dispatcher, as for a delivery's URL
    assert bearer_receiver.requests == []


# -- helpers ----------------------------------------------------------------------------


async def send_one(sender: Sender, message: Job) -> Attempt:
    (attempt,) = await send_all(sender, [message])
    return attempt


def assert_nothing_secret(caplog: pytest.LogCaptureFixture, error: str | None) -> None:
    logged = "\n".join(r.getMessage() for r in caplog.records)
    encoded = base64.b64encode(b"dispatcher+1%3Aa:s3cr3t").decode()[:16]
    for text in (logged, error or ""):
        assert SECRET not in text
        assert "s3cr3t" not in text
        assert encoded not in text
        assert "tok-" not in text


async def test_a_stored_oauth2_client_gets_its_token_to_the_receiver(
    database_url: str, token_server: TokenServer, bearer_receiver: BearerReceiver
) -> None:
    """OAuth2 client credentials stored on an endpoint (sealed) reach a real
    dispatcher's token cache: the receiver gets the token the token endpoint
    issued, fetched with the stored client's id and secret."""
    db = Db(database_url)
    keyring = Keyring([base64.b64decode(generate_key())])
    client = OAuth2ClientCredentials(token_server.url, CLIENT_ID, SECRET, scope="deliver")
    with db.tx() as conn:
        Endpoints(keyring=keyring).add(conn, url=bearer_receiver.url, oauth2=client)
        Outbox().publish(conn, "order.paid", {"n": 1})
    bearer_receiver.valid.add("tok-1-".ljust(token_server.token_length, "x"))  # the first issued
    async with running(db, fast_config(keyring=keyring)):
        await wait_until(
            lambda: db.query("SELECT count(*) FROM outbox.delivered") == [(1,)], seconds=30
        )
    assert token_server.fetches == 1 and token_server.forms[0]["scope"] == ["deliver"]
    assert bearer_receiver.tokens() == token_server.issued
