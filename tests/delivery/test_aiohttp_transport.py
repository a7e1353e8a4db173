"""The aiohttp HTTP path (``http_client="aiohttp"``): the httpx path's behaviour, held
against real servers on 127.0.0.1.

Success with every header, 5xx retry, timeouts, resets, bounded reads, redirects,
the SSRF guard (zero connections reach a refused server) and TLS verified by host
name. Nothing here sends a packet anywhere but 127.0.0.1: a ``::1`` listener is only
ever refused, and a fake resolver stands in for names that are not ``localhost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from ipaddress import ip_address
from typing import Any

import httpx
import psycopg
import pytest
import trustme
from standardwebhooks.webhooks import Webhook

from dispatchers.cli import main
from dispatchers.delivery.http import AiohttpClient, Attempt, Sender
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.outcome import Verdict
from dispatchers.delivery.ssrf import AddressPolicy, BlockedDestination
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import Outbox
from outbox.errors import ConfigurationError
from outbox.secrets import generate_secret
from tests.dispatching import fast_config
from tests.jobs import job as make_job
from tests.rawserver import Handler, RawServer, read_request
from tests.receiver import Receiver, Reply
from tests.timing import LATE

MIB = 1024 * 1024
HUGE = 50 * MIB
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def keep_alive(reply: bytes) -> Handler:
    """Answer ``reply`` to every request on the connection until the client closes it."""

    def handler(conn: socket.socket, closed: threading.Event) -> None:
        while not closed.is_set() and read_request(conn):
            conn.sendall(reply)

    return handler


@pytest.fixture
def localhost_is_loopback() -> None:
    try:
        infos = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    except OSError as exc:
        pytest.skip(f"localhost does not resolve: {exc}")
    if not all(ip_address(info[4][0]).is_loopback for info in infos):
        pytest.skip("localhost resolves to a non-loopback address")


@pytest.fixture
def ipv6_listener() -> Iterator[RawServer]:
    try:
        server = RawServer(host="::1")
    except OSError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    with server:
        yield server


# -- helpers -----------------------------------------------------------------------------


SENDING = {
    "http_client": "aiohttp",
    "request_timeout": 2.0,
    "connect_timeout": 1.0,
    "lease": 9.0,
    "concurrency": 4,
}
"""Sending alone, with aiohttp and time for bigger bodies."""


def job(url: str, **overrides: Any) -> Job:
    return make_job(url=url, **overrides)


async def send(config: DispatcherConfig, message: Job) -> Attempt:
    sender = Sender(config)
    try:
        async with asyncio.timeout(config.request_timeout + 5):
            return await sender.send(message)
    finally:
        await sender.aclose()


@contextlib.asynccontextmanager
async def client(policy: AddressPolicy, **kwargs: Any) -> AsyncIterator[AiohttpClient]:
    kwargs.setdefault("connect_timeout", 1.0)
    http = AiohttpClient(policy, **kwargs)
    try:
        yield http
    finally:
        await http.aclose()


async def get(http: AiohttpClient, url: str) -> tuple[int, Any, bytes]:
    async with asyncio.timeout(5):
        return await http.request("GET", url, headers={"Accept-Encoding": "identity"}, body=b"")


# -- success: what is sent, and what is read ---------------------------------------------


async def test_success_carries_body_headers_and_idempotency_key(receiver: Receiver) -> None:
    attempt = await send(fast_config(SENDING), job(receiver.url + "/orders?tenant=acme"))
    assert attempt.outcome.verdict is Verdict.DELIVERED
    assert attempt.outcome.status == 200
    assert attempt.excerpt == "ok"
    (request,) = receiver.requests
    assert (request.method, request.path, request.body) == (
        "POST",
        "/orders?tenant=acme",
        b'{"n":7}',
    )
    headers = request.headers
    assert headers["idempotency-key"] == '"order-7"'
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == "7"
    assert headers["x-tenant"] == "acme"
    assert headers["user-agent"] == "outbox-dispatcher"
    assert headers["accept-encoding"] == "identity"
    assert headers["host"] == receiver.url.removeprefix("http://")
    assert "webhook-signature" not in headers


async def test_webhook_signatures_verify_with_the_reference_implementation(
    receiver: Receiver,
) -> None:
    old, new = generate_secret(), generate_secret()
    message = job(receiver.url, endpoint_id=3, idempotency_key="evt-1:3", secrets=(new, old))
    attempt = await send(fast_config(SENDING), message)
    assert attempt.outcome.verdict is Verdict.DELIVERED
    (request,) = receiver.requests
    assert request.headers["webhook-id"] == "evt-1:3"
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # a receiver holding either secret accepts it
        Webhook(secret).verify(request.body, request.headers)


async def test_keep_alive_connections_are_reused_and_bounded_by_the_limit() -> None:
    with RawServer(keep_alive(OK)) as server:
        async with client(AddressPolicy(allow_private_networks=True), limit=2) as http:
            for _ in range(5):
                assert (await get(http, server.url()))[0] == 200
            assert server.connections == 1
            replies = await asyncio.gather(*(get(http, server.url()) for _ in range(12)))
            assert [status for status, _, _ in replies] == [200] * 12
            assert server.connections <= 2


async def test_compressed_bodies_are_not_decoded() -> None:
    """aiohttp decompresses by default; a dispatcher reads raw bytes, as httpx's
    aiter_raw does, so a bogus gzip body is not an error and not expanded."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd"
    with RawServer(keep_alive(reply)) as server:
        attempt = await send(fast_config(SENDING), job(server.url()))
    assert attempt.outcome.verdict is Verdict.DELIVERED
    assert attempt.excerpt == "abcd"


async def test_proxy_settings_in_the_environment_are_ignored(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RawServer() as proxy:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url(path=""))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        attempt = await send(fast_config(SENDING), job(receiver.url))
        assert proxy.connections == 0
    assert attempt.outcome.verdict is Verdict.DELIVERED
    assert len(receiver.requests) == 1


async def test_a_transport_passed_in_is_used_through_httpx() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    sender = Sender(fast_config(SENDING), transport=httpx.MockTransport(handler))
    try:
        attempt = await sender.send(job("https://example.com/hook"))
    finally:
        await sender.aclose()
    assert attempt.outcome.status == 204
    assert len(seen) == 1


# -- failures: classified as on the httpx path -------------------------------------------


async def test_5xx_is_retried_with_its_retry_after(receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(503, {"Retry-After": "7"}, b"busy")
    attempt = await send(fast_config(SENDING), job(receiver.url))
    assert attempt.outcome.verdict is Verdict.RETRY
    assert (attempt.outcome.status, attempt.outcome.error_class) == (503, "http_503")
    assert attempt.outcome.retry_after == 7.0
    assert attempt.excerpt == "busy"


async def test_4xx_fails_and_410_is_gone(receiver: Receiver) -> None:
    statuses = iter([422, 410])
    receiver.responder = lambda req: Reply(next(statuses))
    failed = await send(fast_config(SENDING), job(receiver.url))
    gone = await send(fast_config(SENDING), job(receiver.url))
    assert (failed.outcome.verdict, failed.outcome.status) == (Verdict.FAILED, 422)
    assert (gone.outcome.verdict, gone.outcome.status) == (Verdict.GONE, 410)


async def test_a_slow_server_is_cut_at_the_request_timeout(receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(delay=0.5 + LATE + 1)  # after any late deadline
    attempt = await send(
        fast_config(SENDING, request_timeout=0.5, connect_timeout=0.5), job(receiver.url)
    )
    assert attempt.outcome.verdict is Verdict.RETRY
    assert (attempt.outcome.status, attempt.outcome.error_class) == (None, "timeout")
    assert 500 - 10 <= attempt.duration_ms < (0.5 + LATE) * 1000  # the deadline ended it


async def test_a_trickling_body_is_cut_at_the_request_timeout() -> None:
    def trickle(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not closed.wait(0.1):
            conn.sendall(b"1\r\nx\r\n")

    with RawServer(trickle) as server:
        attempt = await send(
            fast_config(SENDING, request_timeout=0.6, connect_timeout=0.5), job(server.url())
        )
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (Verdict.RETRY, "timeout")
    # each read makes progress: only the deadline, never sooner, ends the attempt
    assert 600 - 10 <= attempt.duration_ms < (0.6 + LATE) * 1000


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
async def test_timed_out_and_cancelled_attempts_leave_no_timer_behind(http_client: str) -> None:
    requests = threading.Semaphore(0)

    def silent(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        requests.release()
        closed.wait(30)

    sender = Sender(
        fast_config(SENDING, http_client=http_client, request_timeout=0.5, connect_timeout=0.5)
    )
    try:
        with RawServer(silent) as server:
            async with asyncio.timeout(10):
                # cut by the timer
                attempt = await sender.send(job(server.url()))
                assert attempt.outcome.error_class == "timeout"
                assert 500 - 10 <= attempt.duration_ms < (0.5 + LATE) * 1000
                assert (len(sender.deadlines), sender.deadlines.armed) == (0, False)
                assert await asyncio.to_thread(requests.acquire, True, 5)  # it was sent
                # cancelled by its owner (a lost lease) while the receiver holds it
                task = asyncio.create_task(sender.send(job(server.url())))
                assert await asyncio.to_thread(requests.acquire, True, 5)
                assert sender.deadlines.armed
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert (len(sender.deadlines), sender.deadlines.armed) == (0, False)
    finally:
        await sender.aclose()


async def test_a_connection_reset_is_retried(receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(reset=True)
    attempt = await send(fast_config(SENDING), job(receiver.url))
    assert (attempt.outcome.verdict, attempt.outcome.status) == (Verdict.RETRY, None)
    assert attempt.outcome.error_class in ("network_error", "protocol_error")
    assert attempt.duration_ms < 2000  # the reset ended it, before the request deadline


async def test_a_server_that_closes_at_once_is_retried() -> None:
    with RawServer() as server:
        attempt = await send(fast_config(SENDING), job(server.url()))
        assert server.connections >= 1
    assert (attempt.outcome.verdict, attempt.outcome.status) == (Verdict.RETRY, None)
    assert attempt.outcome.error_class in ("protocol_error", "network_error")


async def test_garbage_instead_of_a_status_line_is_a_protocol_error() -> None:
    def garbage(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        conn.sendall(b"\x16\x03\x01\x00\xa5 SSH-2.0-not-http \xff\xfe\r\n\r\n")

    with RawServer(garbage) as server:
        attempt = await send(
            fast_config(SENDING), job(server.url("127.0.0.1", "/hook?token=s3cret"))
        )
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.RETRY,
        "protocol_error",
    )
    assert attempt.outcome.error is not None
    assert "s3cret" not in attempt.outcome.error  # aiohttp's text names the URL; ours not


async def test_a_closed_port_is_a_connect_error() -> None:
    with RawServer() as server:
        url = server.url()
    attempt = await send(fast_config(SENDING), job(url))
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.RETRY,
        "connect_error",
    )


async def test_a_50mb_body_is_read_only_up_to_the_bound() -> None:
    sent: list[int] = []
    finished = threading.Event()

    def error_with_body(conn: socket.socket, closed: threading.Event) -> None:
        read_request(conn)
        conn.sendall(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
            b"Content-Length: " + str(HUGE).encode() + b"\r\n\r\n"
        )
        block = b"E" * (64 * 1024)
        count = 0
        try:
            # streamed from one 64 KiB block: the test never holds 50 MB itself
            while count < HUGE and not closed.is_set():
                conn.sendall(block[: HUGE - count])
                count += min(len(block), HUGE - count)
        finally:
            sent.append(count)
            finished.set()

    with RawServer(error_with_body) as server:
        attempt = await send(fast_config(SENDING, max_response_bytes=64 * 1024), job(server.url()))
        # the client closed the connection: the server's next send fails
        assert await asyncio.to_thread(finished.wait, 10), "the server is still sending"
    # a 500, not a timeout: the read bound ended the attempt, not the request deadline
    assert (attempt.outcome.verdict, attempt.outcome.status) == (Verdict.RETRY, 500)
    assert attempt.excerpt == "E" * 1024
    assert sent[0] < HUGE // 2, f"the server sent {sent[0] / MIB:.1f} MiB"


async def test_a_body_past_the_bound_is_not_read_and_its_connection_not_reused() -> None:
    body = b"x" * (4 * MIB)  # more than aiohttp buffers: the response cannot complete
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    with RawServer(keep_alive(reply)) as server:
        async with client(
            AddressPolicy(allow_private_networks=True), max_response_bytes=1000
        ) as http:
            status, _, data = await get(http, server.url())
            assert (status, data) == (200, body[:1000])
            # the unread rest makes the connection unusable: the next request opens another
            await get(http, server.url())
            assert server.connections == 2


async def test_a_short_body_fully_received_keeps_its_connection() -> None:
    """aiohttp returns a connection to the pool once the whole response has arrived,
    even if less of it was read: nothing of it is left on the wire."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + b"x" * 3000
    with RawServer(keep_alive(reply)) as server:
        async with client(
            AddressPolicy(allow_private_networks=True), max_response_bytes=1000
        ) as http:
            for _ in range(3):
                assert (await get(http, server.url()))[2] == b"x" * 1000
            assert server.connections == 1


async def test_redirects_fail_permanently_and_are_never_followed() -> None:
    with RawServer(keep_alive(OK)) as target:
        location = target.url().encode()
        redirect = b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n"
        with RawServer(keep_alive(redirect)) as server:
            attempt = await send(fast_config(SENDING), job(server.url()))
        assert target.connections == 0
    assert (attempt.outcome.verdict, attempt.outcome.status) == (Verdict.FAILED, 302)
    assert attempt.outcome.error_class == "redirect"


# -- the SSRF guard ----------------------------------------------------------------------


async def test_default_policy_refuses_ipv4_loopback_before_connecting() -> None:
    # aiohttp never gives an IP literal to the resolver: the socket factory refuses it
    with RawServer(keep_alive(OK)) as server:
        attempt = await send(fast_config(SENDING, allow_private_networks=False), job(server.url()))
        async with client(AddressPolicy()) as http:
            with pytest.raises(BlockedDestination) as info:
                await get(http, server.url())
        assert server.connections == 0
    # blocked (held unsent by the dispatcher), no longer failed
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.BLOCKED,
        "blocked_destination",
    )
    assert info.value.address == ip_address("127.0.0.1")
    assert not isinstance(info.value, httpx.HTTPError)


@pytest.mark.usefixtures("localhost_is_loopback")
async def test_default_policy_refuses_a_name_resolving_to_loopback() -> None:
    with RawServer(keep_alive(OK)) as server:
        url = server.url("localhost")
        attempt = await send(fast_config(SENDING, allow_private_networks=False), job(url))
        async with client(AddressPolicy()) as http:
            with pytest.raises(BlockedDestination) as info:
                await get(http, url)
        assert server.connections == 0
    # blocked (held unsent by the dispatcher), no longer failed
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.BLOCKED,
        "blocked_destination",
    )
    assert "'localhost'" in (attempt.outcome.error or "")
    assert info.value.host == "localhost"


@pytest.mark.parametrize("host", ["[::1]", "[::ffff:127.0.0.1]"])
async def test_default_policy_refuses_ipv6_loopback_forms(
    ipv6_listener: RawServer, host: str
) -> None:
    attempt = await send(
        fast_config(SENDING, allow_private_networks=False), job(ipv6_listener.url(host))
    )
    assert ipv6_listener.connections == 0
    # blocked (held unsent by the dispatcher), no longer failed
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.BLOCKED,
        "blocked_destination",
    )


async def test_allow_private_networks_reaches_loopback(receiver: Receiver) -> None:
    attempt = await send(fast_config(SENDING, allow_private_networks=True), job(receiver.url))
    assert attempt.outcome.verdict is Verdict.DELIVERED
    assert len(receiver.requests) == 1


@pytest.mark.usefixtures("localhost_is_loopback")
async def test_an_allow_list_reaches_loopback_by_address_and_by_name(receiver: Receiver) -> None:
    # If localhost also resolves to ::1, that address is dropped and 127.0.0.1 is used.
    cfg = fast_config(SENDING, allow_private_networks=False, allow_networks=("127.0.0.0/8",))
    by_address = await send(cfg, job(receiver.url))
    by_name = await send(cfg, job(receiver.url.replace("127.0.0.1", "localhost")))
    assert by_address.outcome.verdict is Verdict.DELIVERED
    assert by_name.outcome.verdict is Verdict.DELIVERED
    assert [r.headers["host"].split(":")[0] for r in receiver.requests] == [
        "127.0.0.1",
        "localhost",
    ]


async def test_an_allow_list_not_covering_loopback_still_refuses() -> None:
    with RawServer(keep_alive(OK)) as server:
        cfg = fast_config(SENDING, allow_private_networks=False, allow_networks=("10.0.0.0/8",))
        attempt = await send(cfg, job(server.url()))
        assert server.connections == 0
    assert attempt.outcome.error_class == "blocked_destination"


class FakeResolver:
    """Stands in for loop.getaddrinfo; answers from a table and counts lookups."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int, **kwargs: Any) -> list[Any]:
        self.lookups.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (text, port))
            if ip_address(text).version == 4
            else (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (text, port, 0, 0))
            for text in self.answers[host]
        ]


@pytest.fixture
async def resolver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeResolver]:
    fake = FakeResolver({})
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake)
    yield fake


async def test_a_name_is_resolved_once_and_only_allowed_addresses_are_dialled(
    resolver: FakeResolver,
) -> None:
    # 10.9.9.9 comes first: were it dialled, the request would fail (and leave the host)
    resolver.answers["receiver.test"] = ["10.9.9.9", "127.0.0.1"]
    with RawServer(keep_alive(OK)) as server:
        async with client(AddressPolicy.from_strings(["127.0.0.0/8"])) as http:
            for _ in range(3):
                assert (await get(http, server.url("receiver.test")))[0] == 200
        assert server.connections == 1
    assert resolver.lookups == ["receiver.test"]


async def test_a_name_resolving_only_to_refused_addresses_names_the_first(
    resolver: FakeResolver,
) -> None:
    resolver.answers["internal.example"] = ["169.254.169.254", "10.0.0.1"]
    async with client(AddressPolicy()) as http:
        with pytest.raises(BlockedDestination, match=r"'internal\.example'.*169\.254\.169\.254"):
            await get(http, "http://internal.example/latest/meta-data")


async def test_an_unresolvable_name_is_a_connect_error(resolver: FakeResolver) -> None:
    attempt = await send(fast_config(SENDING), job("http://nowhere.example/hook"))
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.RETRY,
        "connect_error",
    )


async def test_slow_resolution_is_a_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    never = asyncio.Event()

    async def hang(*args: Any, **kwargs: Any) -> list[Any]:
        await never.wait()
        return []

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", hang)
    cfg = fast_config(SENDING, request_timeout=2.0, connect_timeout=0.2)
    attempt = await send(cfg, job("http://slow.example/hook"))
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (Verdict.RETRY, "timeout")
    assert (attempt.outcome.error or "").startswith("connect timeout")
    assert attempt.duration_ms < 2000  # the connect timeout ended it, before the request's


# -- TLS: verified against the URL's host, not the address connected to ------------------


@pytest.fixture
def tls_ca() -> trustme.CA:
    return trustme.CA()


class TlsServer(RawServer):
    """RawServer behind TLS with a certificate for "localhost"; records SNI names."""

    def __init__(self, ca: trustme.CA) -> None:
        self.sni: list[str | None] = []
        self.requests = 0
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("localhost").configure_cert(self.context)
        self.context.sni_callback = self._record_sni
        super().__init__(self._handle)

    def _record_sni(self, sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        self.sni.append(name)

    def _handle(self, conn: socket.socket, closed: threading.Event) -> None:
        with self.context.wrap_socket(conn, server_side=True) as tls:
            while read_request(tls):
                self.requests += 1
                tls.sendall(OK)


@pytest.fixture
def tls_server(tls_ca: trustme.CA) -> Iterator[TlsServer]:
    with TlsServer(tls_ca) as server:
        yield server


@pytest.fixture
def trusting(tls_ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    tls_ca.configure_trust(context)
    return context


@pytest.mark.usefixtures("localhost_is_loopback")
async def test_tls_verifies_the_original_host_name(
    tls_server: TlsServer, trusting: ssl.SSLContext
) -> None:
    async with client(AddressPolicy.from_strings(["127.0.0.0/8"]), verify=trusting) as http:
        status, _, body = await get(http, tls_server.url("localhost", scheme="https"))
    assert (status, body) == (200, b"ok")
    # connected to 127.0.0.1, yet SNI and the certificate check used "localhost"
    assert tls_server.sni == ["localhost"]


async def test_tls_rejects_a_certificate_for_another_name(
    tls_server: TlsServer, trusting: ssl.SSLContext
) -> None:
    async with client(AddressPolicy.from_strings(["127.0.0.0/8"]), verify=trusting) as http:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await get(http, tls_server.url("127.0.0.1", scheme="https"))
    assert tls_server.requests == 0


@pytest.mark.usefixtures("localhost_is_loopback")
@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
async def test_tls_verification_is_on_by_default(tls_server: TlsServer, http_client: str) -> None:
    """The dispatcher trusts certifi's roots, not this test CA: a connect error,
    whichever client sends."""
    cfg = fast_config(
        SENDING,
        http_client=http_client,
        allow_private_networks=False,
        allow_networks=("127.0.0.0/8",),
    )
    attempt = await send(cfg, job(tls_server.url("localhost", scheme="https")))
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.RETRY,
        "connect_error",
    )
    assert "CERTIFICATE_VERIFY_FAILED" in (attempt.outcome.error or "")
    assert tls_server.requests == 0


# -- the dispatcher, its settings and the command line ----------------------------------


def test_http_client_is_validated_by_name() -> None:
    assert DispatcherConfig().http_client == "aiohttp"
    assert DispatcherConfig(http_client="httpx").http_client == "httpx"
    with pytest.raises(ConfigurationError, match=r"^http_client: .*'curl'"):
        DispatcherConfig(http_client="curl")


def enqueue(url: str, target: str, key: str) -> int:
    with psycopg.connect(url) as conn:
        return Outbox().enqueue(conn, url=target, idempotency_key=key, json={"key": key})


@pytest.mark.slow
async def test_the_dispatcher_delivers_and_retries_with_aiohttp(
    database_url: str, receiver: Receiver
) -> None:
    replies = iter([Reply(503), Reply(200)])
    receiver.responder = lambda req: next(replies, Reply(200))
    mid = enqueue(database_url, receiver.url + "/orders", "aio-1")
    cfg = fast_config(http_client="aiohttp", concurrency=4)
    dispatcher = Dispatcher(database_url, cfg, log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.to_thread(receiver.wait_for, 2, 10.0)
    finally:
        dispatcher.stop()  # in-flight deliveries finish and are recorded first
        async with asyncio.timeout(20):
            await task
    assert dispatcher.stats.delivered == 1
    assert [r.headers["idempotency-key"] for r in receiver.requests] == ['"aio-1"', '"aio-1"']
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT attempt, outcome, status FROM outbox.attempts"
            " WHERE message_id = %s ORDER BY attempt",
            (mid,),
        ).fetchall()
    assert rows == [(1, "retry", 503), (2, "delivered", 200)]


def test_outbox_dispatch_http_client_aiohttp_delivers(
    database_url: str, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue(database_url, receiver.url, "cli-aio-1")
    code = main(
        [
            *("dispatch", "--database-url", database_url, "--drain"),
            *("--http-client", "aiohttp", "--allow-private-networks"),
            *("--request-timeout", "2", "--lease", "9", "--log-format", "json"),
        ]
    )
    assert code == 0
    assert "delivered 1" in capsys.readouterr().err
    assert [r.headers["idempotency-key"] for r in receiver.requests] == ['"cli-aio-1"']


def test_outbox_dispatch_refuses_an_unknown_http_client(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["dispatch", "--http-client", "curl"])
    assert info.value.code == 2
    assert "--http-client" in capsys.readouterr().err
