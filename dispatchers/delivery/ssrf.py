"""SSRF guard: refuse destinations that resolve to non-public addresses.

Each new connection resolves the name once, checks every address against an
:class:`AddressPolicy`, and connects to the checked address only (httpcore
backend; aiohttp resolver and socket factory). TLS still checks the URL's host.
:class:`BlockedDestination` leaves both clients unwrapped. Non-canonical IPv4
hosts are invalid URLs on both paths; through a proxy, :class:`ProxiedDestinations`
applies the same policy.

The module stays whole past the usual length: the policy, the hooks of both
clients and the proxied check must refuse exactly the same addresses.

Design: docs/explanation/design/ssrf.md
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

import aiohttp
import httpcore
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from dispatchers.delivery.proxy import Proxy
from outbox.errors import ConfigurationError, OutboxError
from outbox.internal import ipv4_host_problem

__all__ = [
    "DEFAULT_LIMITS",
    "AddressPolicy",
    "BlockedDestination",
    "GuardedNetworkBackend",
    "GuardedResolver",
    "ProxiedDestinations",
    "guarded_connector",
    "guarded_transport",
]

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

# Connection pool limits used when the caller gives none (the same values as httpx's).
DEFAULT_LIMITS = httpx.Limits(
    max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0
)

# IPv4 blocks that are not global unicast (IANA special-purpose registry, plus multicast
# and the old class E space). Kept here rather than relying on ``ipaddress.is_global``,
# whose tables differ between Python patch releases.
_IPV4_NON_GLOBAL = tuple(
    IPv4Network(cidr)
    for cidr in (
        "0.0.0.0/8",  # "this network", including the unspecified address
        "10.0.0.0/8",  # RFC 1918 private
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local (cloud metadata services live here)
        "172.16.0.0/12",  # RFC 1918 private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # deprecated 6to4 relay anycast
        "192.168.0.0/16",  # RFC 1918 private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, including the limited broadcast 255.255.255.255
    )
)

# Only 2000::/3 holds global unicast IPv6; this excludes ::, ::1, 100::/64, fc00::/7,
# fe80::/10, fec0::/10, ff00::/8 and the rest of the unassigned space in one test.
_IPV6_GLOBAL_UNICAST = IPv6Network("2000::/3")
_IPV6_NON_GLOBAL = tuple(
    IPv6Network(cidr)
    for cidr in (
        "2001::/23",  # IETF protocol assignments: Teredo, benchmarking, ORCHID, ...
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
    )
)
# Forms that carry an IPv4 address in their low bits; judged by that IPv4 address.
_IPV4_COMPATIBLE = IPv6Network("::/96")  # deprecated; also holds :: and ::1
_NAT64_WELL_KNOWN = IPv6Network("64:ff9b::/96")


class BlockedDestination(OutboxError):
    """The destination resolved only to addresses the guard refuses.

    ``host`` is the name (or literal) that was asked for and ``address`` the first
    refused address; both are ``None`` when not applicable (a Unix socket).
    """

    def __init__(
        self, message: str, *, host: str | None = None, address: IPAddress | None = None
    ) -> None:
        super().__init__(message)
        self.host = host
        self.address = address


def _embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, -compatible, 6to4 or NAT64 address."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _IPV4_COMPATIBLE or address in _NAT64_WELL_KNOWN:
        return IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def _is_global_unicast(address: IPAddress) -> bool:
    """Whether ``address`` is a public unicast address, reachable across the Internet."""
    if isinstance(address, IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return _is_global_unicast(embedded)
        return address in _IPV6_GLOBAL_UNICAST and not any(
            address in network for network in _IPV6_NON_GLOBAL
        )
    return not any(address in network for network in _IPV4_NON_GLOBAL)


def _blocked(host: str, address: IPAddress) -> BlockedDestination:
    return BlockedDestination(
        f"refusing to connect to {host!r}: it resolves to {address}, which is not a public"
        " unicast address; to allow it, use --allow-private-networks or add a CIDR"
        " containing it to the allow-list",
        host=host,
        address=address,
    )


@dataclass(frozen=True)
class AddressPolicy:
    """Which destination addresses the guard lets the dispatcher connect to.

    Global unicast addresses are always allowed. ``allow`` lists extra CIDRs that are
    permitted although non-global (an IPv6 address that embeds an IPv4 one matches if
    either form is inside a CIDR); ``allow_private_networks`` permits every address.
    """

    allow_private_networks: bool = False
    allow: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_strings(
        cls, allow: Iterable[str], *, allow_private_networks: bool = False
    ) -> AddressPolicy:
        """Build a policy from CIDR strings such as ``"10.0.0.0/8"`` or ``"::1"``.

        Raises ``ConfigurationError`` naming the first string that is not a CIDR, or
        that has host bits set (``"10.0.0.1/8"``).
        """
        if isinstance(allow, str):
            raise ConfigurationError(
                f"allow-list must be a list of CIDRs, not the string {allow!r}"
            )
        networks: list[IPNetwork] = []
        for cidr in allow:
            try:
                networks.append(ipaddress.ip_network(cidr.strip(), strict=True))
            except ValueError as exc:
                raise ConfigurationError(f"invalid allow-list CIDR {cidr!r}: {exc}") from exc
        return cls(allow_private_networks=allow_private_networks, allow=tuple(networks))

    def is_allowed(self, address: IPAddress) -> bool:
        """Whether the guard may connect to ``address``."""
        if self.allow_private_networks or _is_global_unicast(address):
            return True
        forms: list[IPAddress] = [address]
        if isinstance(address, IPv6Address):
            embedded = _embedded_ipv4(address)
            if embedded is not None:
                forms.append(embedded)
        return any(form in network for form in forms for network in self.allow)

    def check(self, host: str, address: IPAddress) -> None:
        """Raise ``BlockedDestination`` unless ``address`` (resolved from ``host``) is allowed."""
        if not self.is_allowed(address):
            raise _blocked(host, address)


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _ip_addresses(infos: Iterable[tuple[Any, ...]]) -> list[IPAddress]:
    """The IP addresses in ``getaddrinfo`` results, without duplicates, in order."""
    addresses: list[IPAddress] = []
    for family, _type, _proto, _canonname, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def _allowed_addresses(
    policy: AddressPolicy,
    host: str,
    port: int,
    deadline: float | None,
    *,
    timed_out: type[Exception],
    failed: type[Exception],
) -> list[IPAddress]:
    """The addresses of ``host`` that ``policy`` allows, in resolver order (an IP
    literal is checked as it is); ``deadline`` (loop time) bounds the resolution.

    Raises ``BlockedDestination`` when none is allowed, ``httpx.InvalidURL`` for
    an IPv4 address in a non-canonical form, and ``timed_out`` or ``failed`` (the
    caller's exception types) when the name does not resolve in time or at all.
    """
    if (problem := ipv4_host_problem(host)) is not None:
        raise httpx.InvalidURL(problem)
    literal = _ip_literal(host)
    if literal is not None:
        policy.check(host, literal)
        return [literal]
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(deadline):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError as exc:  # before OSError: TimeoutError is a subclass
        raise timed_out(f"resolving {host!r} timed out") from exc
    except OSError as exc:
        raise failed(f"could not resolve {host!r}: {exc}") from exc
    resolved = _ip_addresses(infos)
    if not resolved:
        raise failed(f"{host!r} resolved to no IP addresses")
    allowed = [address for address in resolved if policy.is_allowed(address)]
    if not allowed:
        raise _blocked(host, resolved[0])
    return allowed


ALLOWED_FOR = 10.0
"""Seconds a destination found allowed through a proxy stays allowed (aiohttp's
DNS cache keeps an answer as long)."""

MAX_ALLOWED = 10_000
"""Allowed destinations remembered at most; past it the memory starts again."""


class ProxiedDestinations:
    """The guard for deliveries sent through a forward proxy.

    Through a proxy the dispatcher connects only to the proxy, so the hooks above
    (which check the address connected to) would check the proxy's. Instead,
    :meth:`check` resolves each request's destination here, as the hooks would,
    and refuses it unless ``policy`` allows one of its addresses; the proxy's own
    address is not checked. The proxy then resolves the name again (a ``CONNECT``
    or an absolute-form request carries the name, so that its own allow-lists by
    name keep working): a name that answers differently to the proxy is not seen
    here. Close that gap at the proxy by refusing private destinations there too
    (Squid: a ``dst`` ACL of the private ranges with ``http_access deny``;
    Smokescreen does by default). The check needs the dispatcher to resolve
    destination names: where only the proxy can, turn the guard off
    (``allow_private_networks``) and refuse private destinations at the proxy
    instead.

    A name found allowed stays allowed for :data:`ALLOWED_FOR` seconds, as
    aiohttp's DNS cache keeps the direct path's checked answers: a lookup per
    request took about 70 us (a round trip through the loop's resolver thread),
    where the aiohttp path spends about 235 us of CPU per delivery in all.
    """

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._allowed_until: dict[tuple[str, int], float] = {}

    async def check(self, host: str, port: int, *, within: float | None) -> None:
        """Raise ``BlockedDestination`` unless the policy allows an address of
        ``host``; ``httpx.ConnectError`` or ``httpx.ConnectTimeout`` when it does
        not resolve within ``within`` seconds, ``httpx.InvalidURL`` for a
        malformed host."""
        if self._policy.allow_private_networks:  # nothing to refuse: no lookup
            if (problem := ipv4_host_problem(host)) is not None:
                raise httpx.InvalidURL(problem)
            return
        now = asyncio.get_running_loop().time()
        destination = (host, port)
        if self._allowed_until.get(destination, 0.0) > now:
            return
        await _allowed_addresses(
            self._policy,
            host,
            port,
            None if within is None else now + within,
            timed_out=httpx.ConnectTimeout,
            failed=httpx.ConnectError,
        )
        if len(self._allowed_until) >= MAX_ALLOWED:
            self._allowed_until.clear()
        self._allowed_until[destination] = now + ALLOWED_FOR


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to addresses ``policy`` allows.

    Host names are resolved here with the running asyncio loop, so this backend works
    under asyncio only. Connections are made by ``inner`` (default
    ``httpcore.AnyIOBackend()``) to IP literals.
    """

    def __init__(
        self, policy: AddressPolicy, *, inner: httpcore.AsyncNetworkBackend | None = None
    ) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Resolve ``host``, drop refused addresses, connect to the first that answers.

        ``timeout`` bounds resolution and connection attempts together.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        candidates = await _allowed_addresses(
            self._policy,
            host,
            port,
            deadline,
            timed_out=httpcore.ConnectTimeout,
            failed=httpcore.ConnectError,
        )

        options = None if socket_options is None else list(socket_options)
        *others, last = candidates
        for address in others:
            try:
                return await self._attempt(host, address, port, deadline, local_address, options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout):
                continue
        return await self._attempt(host, last, port, deadline, local_address, options)

    async def _attempt(
        self,
        host: str,
        address: IPAddress,
        port: int,
        deadline: float | None,
        local_address: str | None,
        socket_options: list[httpcore.SOCKET_OPTION] | None,
    ) -> httpcore.AsyncNetworkStream:
        remaining = None
        if deadline is not None:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise httpcore.ConnectTimeout(f"connecting to {host!r} timed out")
        return await self._inner.connect_tcp(
            str(address),
            port,
            timeout=remaining,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Always refuse: a Unix socket bypasses every address check."""
        raise BlockedDestination(
            f"refusing to connect to Unix socket {path!r}: the SSRF guard allows TCP only"
        )

    async def sleep(self, seconds: float) -> None:
        """Delegate to the inner backend."""
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose connection pool uses ``GuardedNetworkBackend``,
    or, through a proxy, whose requests :class:`ProxiedDestinations` checks first."""

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        verify: ssl.SSLContext | bool,
        limits: httpx.Limits,
        http2: bool,
        proxy: Proxy | None,
    ) -> None:
        # trust_env=False: environment variables are read only by the CLI entry point.
        ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False)
        super().__init__(verify=ssl_context, trust_env=False, limits=limits, http2=http2)
        # httpx has no public way to choose httpcore's network backend, so replace the
        # pool it just built (still unused, holding no connections) with an identical
        # one that connects through the guard, or through the proxy (given without
        # credentials in its URL). This is the only private attribute we touch.
        pool: httpcore.AsyncConnectionPool
        self._destinations: ProxiedDestinations | None = None
        if proxy is None:
            pool = httpcore.AsyncConnectionPool(
                ssl_context=ssl_context,
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry,
                http1=True,
                http2=http2,
                network_backend=GuardedNetworkBackend(policy),
            )
        else:
            pool = httpcore.AsyncHTTPProxy(
                proxy_url=proxy.url,
                proxy_auth=proxy.credentials,
                ssl_context=ssl_context,
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry,
                http1=True,
                http2=http2,
            )
            self._destinations = ProxiedDestinations(policy)
        self._pool = pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._destinations is not None:
            url = request.url
            port = url.port or (443 if url.scheme == "https" else 80)
            timeouts = request.extensions.get("timeout", {})
            await self._destinations.check(url.host, port, within=timeouts.get("connect"))
        return await super().handle_async_request(request)


def guarded_transport(
    policy: AddressPolicy,
    *,
    verify: ssl.SSLContext | bool = True,
    limits: httpx.Limits = DEFAULT_LIMITS,
    http2: bool = False,
    proxy: Proxy | None = None,
) -> httpx.AsyncHTTPTransport:
    """An httpx transport that connects only to addresses ``policy`` allows, or
    through ``proxy`` only to destinations it allows (see :class:`ProxiedDestinations`).

    ``verify`` is an ``ssl.SSLContext``, ``True`` (certifi's CA bundle) or ``False``;
    no proxy is taken from the environment. A refused request raises
    ``BlockedDestination`` unchanged out of the client.
    """
    return _GuardedTransport(policy, verify=verify, limits=limits, http2=http2, proxy=proxy)


# -- the aiohttp path ----------------------------------------------------------------------


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that returns only addresses ``policy`` allows.

    Resolves with the running loop's ``getaddrinfo`` (once per lookup; aiohttp's DNS
    cache may keep the checked answer for a few seconds). Raises ``BlockedDestination``
    when every address is refused, ``OSError`` when the name does not resolve (aiohttp
    reports it as ``ClientConnectorDNSError``) and ``aiohttp.ConnectionTimeoutError``
    when resolving takes longer than ``timeout`` seconds.
    """

    def __init__(self, policy: AddressPolicy, *, timeout: float | None = None) -> None:
        self._policy = policy
        self._timeout = timeout

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The allowed addresses of ``host``, in resolver order."""
        if (problem := ipv4_host_problem(host)) is not None:
            raise aiohttp.InvalidURL(host, problem)
        literal = _ip_literal(host)
        if literal is not None:  # aiohttp resolves literals itself; checked all the same
            self._policy.check(host, literal)
            return [_resolve_result(host, literal, port)]
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(f"resolving {host!r} timed out") from exc
        resolved = _ip_addresses(infos)
        if not resolved:
            raise OSError(f"{host!r} resolved to no IP addresses")
        allowed = [address for address in resolved if self._policy.is_allowed(address)]
        if not allowed:
            raise _blocked(host, resolved[0])
        return [_resolve_result(host, address, port) for address in allowed]

    async def close(self) -> None:
        """Nothing to release."""


def _resolve_result(host: str, address: IPAddress, port: int) -> ResolveResult:
    return {
        "hostname": host,
        "host": str(address),
        "port": port,
        "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
        "proto": socket.IPPROTO_TCP,
        "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
    }


def _guarded_socket_factory(
    policy: AddressPolicy,
) -> Callable[[tuple[Any, ...]], socket.socket]:
    """A socket factory for aiohttp that refuses to make a socket for a refused address.

    aiohttp calls it with the address it is about to connect to, so the check is on the
    address actually connected to, IP literals included.
    """

    def make_socket(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _canonname, sockaddr = addr_info
        address = ipaddress.ip_address(sockaddr[0])
        policy.check(str(address), address)
        return socket.socket(family=family, type=type_, proto=proto)

    return make_socket


def guarded_connector(
    policy: AddressPolicy,
    *,
    verify: ssl.SSLContext | bool = True,
    limit: int = 100,
    keepalive_expiry: float = 5.0,
    connect_timeout: float | None = None,
    proxied: bool = False,
) -> aiohttp.TCPConnector:
    """An aiohttp connector that connects only to addresses ``policy`` allows.

    ``verify`` is an ``ssl.SSLContext``, ``True`` (certifi's CA bundle) or ``False``;
    ``limit`` bounds the connections open at once; ``connect_timeout`` bounds name
    resolution. Addresses are tried one after another (no happy eyeballs), as on the
    httpx path. Use it with ``aiohttp.ClientSession(trust_env=False)`` (the default)
    so no proxy is taken from the environment. Must be called with a running loop.

    ``proxied``: every request made with it names a proxy, so it connects only to
    the proxy, whose address is not checked; the caller checks each destination
    with :class:`ProxiedDestinations` instead.
    """
    ssl_arg: ssl.SSLContext | bool = (
        httpx.create_ssl_context(verify=True, trust_env=False) if verify is True else verify
    )
    if proxied:
        return aiohttp.TCPConnector(
            ssl=ssl_arg, limit=limit, keepalive_timeout=keepalive_expiry, happy_eyeballs_delay=None
        )
    return aiohttp.TCPConnector(
        resolver=GuardedResolver(policy, timeout=connect_timeout),
        socket_factory=_guarded_socket_factory(policy),
        ssl=ssl_arg,
        limit=limit,
        keepalive_timeout=keepalive_expiry,
        happy_eyeballs_delay=None,
    )
