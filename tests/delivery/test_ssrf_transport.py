"""The SSRF guard in the HTTP stack: real requests to a receiver on 127.0.0.1 / ::1.

Traffic goes only to loopback; tests that need other addresses use a fake resolver and
a fake inner network backend that opens no sockets.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from typing import Any

import httpcore
import httpx
import pytest
import trustme

from dispatchers.delivery.ssrf import (
    AddressPolicy,
    BlockedDestination,
    GuardedNetworkBackend,
    guarded_transport,
)


class _Server(ThreadingHTTPServer):
    def __init__(self, host: str, family: socket.AddressFamily) -> None:
        self.address_family = family
        self.received: list[tuple[str, str]] = []  # (path, Host header)
        self.sni: list[str | None] = []
        super().__init__((host, 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.received.append((self.path, self.headers.get("Host", "")))
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Receiver:
    server: _Server
    port: int = field(init=False)

    def __post_init__(self) -> None:
        self.port = self.server.server_address[1]

    def url(self, host: str, scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}/hook"

    @property
    def received(self) -> list[tuple[str, str]]:
        return self.server.received


def _serve(server: _Server) -> Iterator[Receiver]:
    thread = threading.Thread(
        target=server.serve_forever, args=(0.01,), name="ssrf-receiver", daemon=True
    )
    thread.start()
    try:
        yield Receiver(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from _serve(_Server("127.0.0.1", socket.AF_INET))


@pytest.fixture
def receiver_v6() -> Iterator[Receiver]:
    try:
        server = _Server("::1", socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    yield from _serve(server)


@pytest.fixture
def localhost_is_loopback() -> None:
    try:
        infos = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    except OSError as exc:
        pytest.skip(f"localhost does not resolve: {exc}")
    if not all(ip_address(info[4][0]).is_loopback for info in infos):
        pytest.skip("localhost resolves to a non-loopback address")


@pytest.fixture
def tls_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_receiver(tls_ca: trustme.CA) -> Iterator[Receiver]:
    server = _Server("127.0.0.1", socket.AF_INET)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_ca.issue_cert("localhost").configure_cert(context)

    def record_sni(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        server.sni.append(name)

    context.sni_callback = record_sni
    server.socket = context.wrap_socket(server.socket, server_side=True)
    yield from _serve(server)


async def _get(policy: AddressPolicy, url: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(transport=guarded_transport(policy, **kwargs)) as client:
        return await client.get(url)


# --- default policy: loopback refused before any byte is sent ---------------------------


async def test_default_policy_refuses_ipv4_loopback_literal(receiver: Receiver) -> None:
    with pytest.raises(BlockedDestination) as info:
        await _get(AddressPolicy(), receiver.url("127.0.0.1"))
    assert info.value.address == ip_address("127.0.0.1")
    assert "--allow-private-networks" in str(info.value)
    assert receiver.received == []


@pytest.mark.usefixtures("localhost_is_loopback")
async def test_default_policy_refuses_a_name_resolving_to_loopback(receiver: Receiver) -> None:
    with pytest.raises(BlockedDestination) as info:
        await _get(AddressPolicy(), receiver.url("localhost"))
    assert info.value.host == "localhost"
    assert receiver.received == []


async def test_default_policy_refuses_ipv6_loopback(receiver_v6: Receiver) -> None:
    with pytest.raises(BlockedDestination) as info:
        await _get(AddressPolicy(), receiver_v6.url("[::1]"))
    assert info.value.address == ip_address("::1")
    assert receiver_v6.received == []


async def test_blocked_destination_is_not_an_httpx_error(receiver: Receiver) -> None:
    # httpx re-raises exceptions it does not map, so callers catch BlockedDestination
    # itself; `except httpx.HTTPError` does not swallow it into a retryable failure.
    with pytest.raises(BlockedDestination) as info:
        await _get(AddressPolicy(), receiver.url("127.0.0.1"))
    assert not isinstance(info.value, httpx.HTTPError)


# --- relaxed policies ---------------------------------------------------------------------


async def test_allow_private_networks_reaches_loopback(receiver: Receiver) -> None:
    response = await _get(AddressPolicy(allow_private_networks=True), receiver.url("127.0.0.1"))
    assert response.status_code == 200
    assert response.text == "ok"
    assert receiver.received == [("/hook", f"127.0.0.1:{receiver.port}")]


async def test_allow_private_networks_reaches_ipv6_loopback(receiver_v6: Receiver) -> None:
    response = await _get(AddressPolicy(allow_private_networks=True), receiver_v6.url("[::1]"))
    assert response.status_code == 200
    assert len(receiver_v6.received) == 1


async def test_allow_list_covering_loopback_reaches_it(receiver: Receiver) -> None:
    response = await _get(AddressPolicy.from_strings(["127.0.0.0/8"]), receiver.url("127.0.0.1"))
    assert response.status_code == 200
    assert len(receiver.received) == 1


@pytest.mark.usefixtures("localhost_is_loopback")
async def test_allow_list_covering_loopback_reaches_it_by_name(receiver: Receiver) -> None:
    # If localhost also resolves to ::1, that address is dropped and 127.0.0.1 is used.
    response = await _get(AddressPolicy.from_strings(["127.0.0.0/8"]), receiver.url("localhost"))
    assert response.status_code == 200
    assert receiver.received == [("/hook", f"localhost:{receiver.port}")]


async def test_allow_list_not_covering_loopback_still_refuses(receiver: Receiver) -> None:
    with pytest.raises(BlockedDestination):
        await _get(AddressPolicy.from_strings(["10.0.0.0/8"]), receiver.url("127.0.0.1"))
    assert receiver.received == []


# --- TLS: the certificate is checked against the URL's host, not the IP connected to --


@pytest.mark.usefixtures("localhost_is_loopback")
async def test_tls_verifies_the_original_host_name(
    tls_ca: trustme.CA, tls_receiver: Receiver
) -> None:
    client_context = ssl.create_default_context()
    tls_ca.configure_trust(client_context)
    policy = AddressPolicy.from_strings(["127.0.0.0/8"])
    response = await _get(policy, tls_receiver.url("localhost", "https"), verify=client_context)
    assert response.status_code == 200
    # Connected to 127.0.0.1, yet SNI and the certificate check used "localhost".
    assert tls_receiver.server.sni == ["localhost"]


async def test_tls_rejects_a_certificate_for_another_name(
    tls_ca: trustme.CA, tls_receiver: Receiver
) -> None:
    client_context = ssl.create_default_context()
    tls_ca.configure_trust(client_context)
    policy = AddressPolicy.from_strings(["127.0.0.0/8"])
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await _get(policy, tls_receiver.url("127.0.0.1", "https"), verify=client_context)
    assert tls_receiver.received == []


# --- resolution: one lookup, checked addresses only, connect to the literal ------------


class _FakeResolver:
    """Stands in for loop.getaddrinfo; answers from a table and counts lookups."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int, **kwargs: Any) -> list[Any]:
        self.lookups.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        result: list[Any] = []
        for text in self.answers[host]:
            if ip_address(text).version == 4:
                result.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (text, port)))
            else:
                result.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (text, port, 0, 0)))
        return result


@pytest.fixture
async def resolver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_FakeResolver]:
    fake = _FakeResolver({})
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake)
    yield fake


class _FakeBackend(httpcore.AsyncNetworkBackend):
    """Records connection attempts; opens no sockets."""

    def __init__(self, refusing: frozenset[str] = frozenset()) -> None:
        self.refusing = refusing
        self.attempts: list[tuple[str, int, float | None]] = []
        self.slept: list[float] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        self.attempts.append((host, port, timeout))
        if host in self.refusing:
            raise httpcore.ConnectError(f"connection to {host} refused")
        return httpcore.AsyncNetworkStream()

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def test_connects_to_the_checked_address_not_the_name(resolver: _FakeResolver) -> None:
    resolver.answers["hooks.example"] = ["93.184.215.14"]
    inner = _FakeBackend()
    await GuardedNetworkBackend(AddressPolicy(), inner=inner).connect_tcp("hooks.example", 443)
    assert resolver.lookups == ["hooks.example"]
    assert [host for host, _, _ in inner.attempts] == ["93.184.215.14"]


async def test_refused_addresses_are_skipped_and_never_dialled(resolver: _FakeResolver) -> None:
    resolver.answers["mixed.example"] = ["10.0.0.1", "::1", "2606:4700:4700::1111", "8.8.8.8"]
    inner = _FakeBackend(refusing=frozenset({"2606:4700:4700::1111"}))
    await GuardedNetworkBackend(AddressPolicy(), inner=inner).connect_tcp("mixed.example", 443)
    assert [host for host, _, _ in inner.attempts] == ["2606:4700:4700::1111", "8.8.8.8"]


async def test_name_resolving_only_to_refused_addresses_names_the_first(
    resolver: _FakeResolver,
) -> None:
    resolver.answers["internal.example"] = ["169.254.169.254", "10.0.0.1"]
    inner = _FakeBackend()
    backend = GuardedNetworkBackend(AddressPolicy(), inner=inner)
    with pytest.raises(BlockedDestination, match=r"'internal\.example'.*169\.254\.169\.254"):
        await backend.connect_tcp("internal.example", 80)
    assert inner.attempts == []


async def test_when_every_address_fails_the_last_error_is_raised(
    resolver: _FakeResolver,
) -> None:
    resolver.answers["down.example"] = ["8.8.8.8", "1.1.1.1"]
    inner = _FakeBackend(refusing=frozenset({"8.8.8.8", "1.1.1.1"}))
    backend = GuardedNetworkBackend(AddressPolicy(), inner=inner)
    with pytest.raises(httpcore.ConnectError, match=r"1\.1\.1\.1"):
        await backend.connect_tcp("down.example", 80, timeout=5.0)
    assert [host for host, _, _ in inner.attempts] == ["8.8.8.8", "1.1.1.1"]
    assert all(t is not None and 0 < t <= 5.0 for _, _, t in inner.attempts)


async def test_unresolvable_name_is_a_connect_error(resolver: _FakeResolver) -> None:
    backend = GuardedNetworkBackend(AddressPolicy(), inner=_FakeBackend())
    with pytest.raises(httpcore.ConnectError, match=r"could not resolve 'nowhere\.example'"):
        await backend.connect_tcp("nowhere.example", 80)


async def test_slow_resolution_is_a_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    never = asyncio.Event()

    async def hang(*args: Any, **kwargs: Any) -> list[Any]:
        await never.wait()
        return []

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", hang)
    inner = _FakeBackend()
    backend = GuardedNetworkBackend(AddressPolicy(), inner=inner)
    with pytest.raises(httpcore.ConnectTimeout, match=r"resolving 'slow\.example' timed out"):
        await backend.connect_tcp("slow.example", 80, timeout=0.01)
    assert inner.attempts == []


async def test_ip_literals_are_checked_without_resolving(resolver: _FakeResolver) -> None:
    inner = _FakeBackend()
    backend = GuardedNetworkBackend(AddressPolicy(), inner=inner)
    with pytest.raises(BlockedDestination):
        await backend.connect_tcp("::ffff:127.0.0.1", 80)
    await backend.connect_tcp("8.8.8.8", 80)
    assert resolver.lookups == []
    assert [host for host, _, _ in inner.attempts] == ["8.8.8.8"]


async def test_unix_sockets_are_refused_and_sleep_is_delegated() -> None:
    inner = _FakeBackend()
    backend = GuardedNetworkBackend(AddressPolicy(allow_private_networks=True), inner=inner)
    with pytest.raises(BlockedDestination, match="Unix socket"):
        await backend.connect_unix_socket("/run/docker.sock")
    await backend.sleep(0.5)
    assert inner.slept == [0.5]


async def test_transport_sends_the_original_host_header_to_the_checked_address(
    resolver: _FakeResolver, receiver: Receiver
) -> None:
    resolver.answers["receiver.test"] = ["10.9.9.9", "127.0.0.1"]
    policy = AddressPolicy.from_strings(["127.0.0.0/8"])
    response = await _get(policy, receiver.url("receiver.test"))
    assert response.status_code == 200
    assert resolver.lookups == ["receiver.test"]
    assert receiver.received == [("/hook", f"receiver.test:{receiver.port}")]
