"""HTTP delivery: one attempt of one claimed message, classified.

The sender never raises for a failed delivery: every response and transport error
becomes an :class:`~dispatchers.delivery.outcome.Outcome`. It reads at most
``max_response_bytes`` and keeps an excerpt, bounds the attempt by
``request_timeout``, never follows redirects. Two clients (aiohttp, the default,
and httpx) share one error vocabulary (:func:`httpx_error`).

The module stays whole past the usual length: the sender and both clients keep
one contract for an attempt, and side by side is how they are kept alike.

Design: docs/explanation/design/http-delivery.md
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import itertools
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

import aiohttp
import httpx
from yarl import URL

from dispatchers.delivery.client import HttpClient
from dispatchers.delivery.deadline import Deadlines
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.oauth2 import Tokens, TokenUnavailable, basic_authorization
from dispatchers.delivery.outcome import (
    MAX_ERROR_LENGTH,
    Outcome,
    Verdict,
    classify_exception,
    classify_response,
)
from dispatchers.delivery.proxy import Proxy
from dispatchers.delivery.redaction import Sent
from dispatchers.delivery.settings import SendSettings
from dispatchers.delivery.signing import webhook_headers
from dispatchers.delivery.ssrf import (
    AddressPolicy,
    ProxiedDestinations,
    guarded_connector,
    guarded_transport,
)
from dispatchers.delivery.tracing import NO_SPANS, AttemptSpans

TASKS_PER_CLIENT = 4
"""httpcore's pool scans every connection (with a readability probe each) per
request start and close, so its cost grows with the pool: a client per small
group of tasks keeps each pool small. Measured with benchmarks/drain.py: 4 tasks
per client used about half the CPU per message of 16."""

MAX_HEADER_LINE = 16 * 1024
"""Longest response status or header line the aiohttp client accepts (h11, under
httpx, accepts a response head of up to 16 KiB)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt: its outcome, timing and a bounded response excerpt."""

    outcome: Outcome
    started_at: datetime
    duration_ms: int
    excerpt: str | None
    trace_id: str | None = None
    """The attempt's trace (:mod:`dispatchers.delivery.tracing`), for the log lines."""


def idempotency_header(key: str, form: str) -> str:
    """The ``Idempotency-Key`` value: an RFC 8941 string (``"..."``) or the raw key."""
    if form == "raw":
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Sender:
    """Sends claimed messages with the configured HTTP client.

    Webhook messages (those with an endpoint) are signed per Standard Webhooks
    at each attempt: ``webhook-id`` is the message's idempotency key (stable
    across retries and replays), ``webhook-timestamp`` the attempt's time, and
    ``webhook-signature`` one ``v1`` signature per secret in force.

    A message whose endpoint has OAuth2 client credentials (``Job.oauth2``) is sent
    with a bearer token from :attr:`tokens` (:mod:`dispatchers.delivery.oauth2`),
    fetched through the same client; a 401 answer to it drops that token and the
    request is sent once more, with a new one, within the attempt's deadline.

    What an attempt records of an answer (its excerpt, an error text quoting it)
    has every credential its request carried replaced
    (:mod:`dispatchers.delivery.redaction`): a receiver may echo its request.

    :param transport: an httpx transport to use instead of the guarded default
        (for tests, or a custom network stack); the SSRF guard is then the
        transport's business, and ``config.http_client`` is not used. A transport
        passed in is never closed here.
    :param client: any :class:`HttpClient` to send with instead (the same terms
        as ``transport``; never closed here).
    :param spans: starts each attempt's span (default: none).
    """

    def __init__(
        self,
        config: SendSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        client: HttpClient | None = None,
        spans: AttemptSpans = NO_SPANS,
    ) -> None:
        self.config = config
        self.spans = spans
        self._owns_client = client is None and transport is None
        self.deadlines = Deadlines(config.request_timeout)
        """Ends each attempt at ``request_timeout``, from connect to the last byte."""
        self._timed_out = Outcome(
            verdict=Verdict.RETRY,
            status=None,
            error=f"no complete response within {config.request_timeout:g} s",
            error_class="timeout",
            retry_after=None,
        )
        credentials = None if config.proxy is None else config.proxy.credentials
        self._proxy_credentials: tuple[tuple[str, str], ...] = ()
        """The ``Proxy-Authorization`` a forward proxy is sent, which its answer may echo."""
        if credentials is not None:
            pair = base64.b64encode(":".join(credentials).encode()).decode("ascii")
            self._proxy_credentials = (("Proxy-Authorization", "Basic " + pair),)
        self.client: HttpClient
        if client is not None:
            self.client = client
            return
        if transport is not None:
            self.client = HttpxClient([transport], config)
            return
        policy = AddressPolicy.from_strings(
            config.allowed_networks, allow_private_networks=config.allow_private_networks
        )
        # one TLS context for every client: building one per client is costly
        tls: ssl.SSLContext | bool = (
            httpx.create_ssl_context(verify=True, trust_env=False) if config.verify_tls else False
        )
        if config.http_client == "aiohttp":
            self.client = AiohttpClient(
                policy,
                verify=tls,
                limit=config.concurrency,
                connect_timeout=config.connect_timeout,
                max_response_bytes=config.max_response_bytes,
                keep_response_bytes=config.excerpt_bytes,
                proxy=config.proxy,
            )
            return
        count = max(1, -(-config.concurrency // TASKS_PER_CLIENT))
        per_client = -(-config.concurrency // count)
        limits = httpx.Limits(
            max_connections=per_client,
            max_keepalive_connections=per_client,
            keepalive_expiry=30.0,
        )

        def guarded(verify: ssl.SSLContext | bool) -> httpx.AsyncBaseTransport:
            return guarded_transport(policy, verify=verify, limits=limits, proxy=config.proxy)

        self.client = HttpxClient(
            [guarded(tls) for _ in range(count)],
            config,
            owns_transports=True,
            transport_for=guarded,
        )

    @functools.cached_property
    def tokens(self) -> Tokens:
        """The OAuth2 tokens of the endpoints that use them, made on first use; a
        token request may take half an attempt's time (see
        :mod:`dispatchers.delivery.oauth2`)."""
        config = self.config
        return Tokens(self.client, timeout=config.request_timeout / 2, user_agent=config.user_agent)

    async def aclose(self) -> None:
        if "tokens" in self.__dict__:
            await self.tokens.aclose()
        if self._owns_client:
            await self.client.aclose()

    def request_headers(self, job: Job) -> dict[str, str]:
        headers = dict(job.headers)
        if job.auth_headers:
            # the endpoint's own headers and Authorization win over a message's
            # of the same name (none of them is one the outbox sets)
            own = {name.lower() for name in job.auth_headers}
            headers = {n: v for n, v in headers.items() if n.lower() not in own}
            headers.update(job.auth_headers)
        headers["Content-Type"] = job.content_type
        headers["Idempotency-Key"] = idempotency_header(
            job.idempotency_key, self.config.idempotency_key_format
        )
        # defaults for what the message leaves out; header names are case-insensitive
        given = {name.lower() for name in headers}
        if "user-agent" not in given:
            headers["User-Agent"] = self.config.user_agent
        if "accept-encoding" not in given:
            headers["Accept-Encoding"] = "identity"
        if job.endpoint_id is not None:
            headers.update(
                webhook_headers(
                    job.secrets,
                    msg_id=job.idempotency_key,
                    timestamp=int(time.time()),
                    body=job.body,
                )
            )
        return headers

    async def send(self, job: Job) -> Attempt:
        """Make one attempt at delivering ``job``. Raises only CancelledError."""
        config = self.config
        started_at = datetime.now(UTC)
        start = time.monotonic()
        excerpt: str | None = None
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Sender.send must be awaited in a task")
        span = self.spans.start(job)
        deadlines = self.deadlines
        deadlines.add(task)
        sent: dict[str, str] = {}  # the headers sent, once made: what an answer may echo
        try:
            sent = span.inject(self.request_headers(job))
            status, headers, body = await self._exchange(job, sent)
        except TokenUnavailable as exc:
            outcome = self._redacted(exc.outcome, self._token_request(job))
        except asyncio.CancelledError:
            if not deadlines.expired(task):
                span.end(None)
                raise
            outcome = self._timed_out
        except TimeoutError:  # a client's own
            outcome = self._timed_out
        except Exception as exc:
            # a transport error may quote a line of the answer
            outcome = self._redacted(classify_exception(exc), self._request(job, sent))
        else:
            outcome = classify_response(status, headers, retry_statuses=config.retry_statuses)
            if config.excerpt_bytes and body:
                excerpt = self._request(job, sent).redact(
                    body[: config.excerpt_bytes].decode("utf-8", errors="replace"),
                    cut=len(body) >= config.excerpt_bytes,
                )
        finally:
            deadlines.discard(task)
        duration_ms = int((time.monotonic() - start) * 1000)
        span.end(outcome)
        return Attempt(outcome, started_at, duration_ms, excerpt, span.trace_id)

    def _request(self, job: Job, headers: Mapping[str, str]) -> Sent:
        """The credentials of ``job``'s request, sent with ``headers``."""
        return Sent(headers, own=job.auth_headers or (), extra=self._proxy_credentials)

    @staticmethod
    def _token_request(job: Job) -> Sent:
        """The credentials of ``job``'s OAuth2 token request."""
        c = job.oauth2
        if c is None:
            return Sent({})
        return Sent(
            {},
            extra=(
                ("Authorization", basic_authorization(c.client_id, c.client_secret)),
                ("client_secret", c.client_secret),
            ),
        )

    @staticmethod
    def _redacted(outcome: Outcome, sent: Sent) -> Outcome:
        """``outcome`` with no credential of ``sent`` in its error text."""
        error = sent.redact_error(outcome.error, limit=MAX_ERROR_LENGTH)
        return outcome if error == outcome.error else dataclasses.replace(outcome, error=error)

    async def _exchange(
        self, job: Job, headers: dict[str, str]
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Send ``job``'s request, with its bearer token when it has OAuth2
        credentials (a second time, with a new token, after a 401)."""
        credentials = job.oauth2
        if credentials is None:
            return await self.client.request(
                job.method, job.url, headers=headers, body=job.body, tls=job.tls
            )
        for name in [n for n in headers if n.lower() == "authorization"]:
            del headers[name]  # the endpoint's token, not the message's header
        tokens = self.tokens
        token = await tokens.token(job.endpoint_id, credentials)
        headers["Authorization"] = f"Bearer {token}"
        reply = await self.client.request(
            job.method, job.url, headers=headers, body=job.body, tls=job.tls
        )
        if reply[0] != 401:
            return reply
        tokens.invalidate(job.endpoint_id, credentials, token)
        headers["Authorization"] = f"Bearer {await tokens.token(job.endpoint_id, credentials)}"
        return await self.client.request(
            job.method, job.url, headers=headers, body=job.body, tls=job.tls
        )


class HttpxClient:
    """:class:`HttpClient` over httpx: one ``AsyncClient`` per transport, taken in
    turn (see :data:`TASKS_PER_CLIENT`). Redirects are never followed, the
    environment (proxies, netrc) is ignored, and a body is read only up to
    ``config.max_response_bytes``, of which the first ``config.excerpt_bytes`` are
    kept and returned.

    A transport holds one TLS context, so a request with a ``tls`` context of its
    own goes through a client of its own, made by ``transport_for`` on first use
    and kept for as long as this client: the connections of an endpoint with a
    client certificate are never in a pool that serves another destination. (An
    endpoint's context changes only with its material; the client of the old one
    stays, its idle connections closing after the keep-alive expiry.)

    :param owns_transports: close the transports with the clients (otherwise they
        belong to the caller).
    :param transport_for: makes the transport of a ``tls`` context; without it
        (a caller's transport), ``tls`` is not used: the transport's TLS is the
        caller's business.
    """

    def __init__(
        self,
        transports: list[httpx.AsyncBaseTransport],
        config: SendSettings,
        *,
        owns_transports: bool = False,
        transport_for: Callable[[ssl.SSLContext], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        timeout = httpx.Timeout(
            connect=config.connect_timeout,
            read=config.request_timeout,
            write=config.request_timeout,
            pool=config.request_timeout,
        )
        self._timeout = timeout
        self._clients = [self._client(transport) for transport in transports]
        self._turn = itertools.cycle(self._clients)
        self._transport_for = transport_for
        self._by_tls: dict[ssl.SSLContext, httpx.AsyncClient] = {}
        self._limit = config.max_response_bytes
        self._keep = config.excerpt_bytes
        self._owns_transports = owns_transports

    def _client(self, transport: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=transport, timeout=self._timeout, follow_redirects=False, trust_env=False
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        read_limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        if tls is None or self._transport_for is None:
            client = next(self._turn)
        else:
            own = self._by_tls.get(tls)
            if own is None:
                own = self._by_tls[tls] = self._client(self._transport_for(tls))
            client = own
        request = client.build_request(method, url, content=body, headers=headers)
        response = await client.send(request, stream=True)
        try:
            if read_limit is None:
                data = await self._read_bounded(response, self._limit, self._keep)
            else:
                data = await self._read_bounded(response, read_limit, read_limit)
        finally:
            await response.aclose()
        return response.status_code, response.headers, data

    @staticmethod
    async def _read_bounded(response: httpx.Response, limit: int, keep: int) -> bytes:
        """Read up to ``limit`` bytes, keeping the first ``keep``; the rest is never
        read (closing the response then drops the connection instead of reusing it)."""
        kept: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_raw():
                if size < keep:
                    kept.append(chunk[: keep - size])
                size += len(chunk)
                if size >= limit:
                    break
        except httpx.StreamConsumed:
            # a transport that returns an already-read response (such as
            # httpx.MockTransport): the body is in memory, nothing to bound
            return response.content[: min(limit, keep)]
        return b"".join(kept)

    async def aclose(self) -> None:
        # a client closes its transport: clients over a caller's transport are
        # left open, as they hold nothing the transport does not
        if self._owns_transports:
            for client in (*self._clients, *self._by_tls.values()):
                await client.aclose()


class AiohttpClient:
    """A small HTTP client on aiohttp with the guarantees of the httpx path.

    One ``aiohttp.ClientSession`` over :func:`~dispatchers.delivery.ssrf.guarded_connector`
    (the SSRF guard: one resolution, refused addresses never dialled, IP literals
    checked, TLS verified against the URL's host), holding at most ``limit``
    connections. With a ``proxy``, every request goes through it and the guard
    checks each request's destination instead
    (:class:`~dispatchers.delivery.ssrf.ProxiedDestinations`). A request's own ``tls``
    context is aiohttp's ``ssl`` for it, and aiohttp keeps the connections of
    each context in a pool of their own. Redirects are not followed, no proxy is
    taken from the environment, no cookie is ever used, bodies are not
    decompressed (aiohttp would by default) and never read past
    ``max_response_bytes``; only their first ``keep_response_bytes`` (default:
    all that is read) are kept and returned. The session is made on first use,
    inside the running loop. ``connect_timeout`` bounds resolution and each
    connection attempt; the caller bounds the whole request (``Sender`` does,
    with ``request_timeout``).

    :meth:`request` raises ``BlockedDestination`` for a refused destination and
    httpx's exception types (:func:`httpx_error`) for transport failures.
    """

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        verify: ssl.SSLContext | bool = True,
        limit: int = 100,
        connect_timeout: float | None = 5.0,
        max_response_bytes: int = 64 * 1024,
        keep_response_bytes: int | None = None,
        keepalive_expiry: float = 30.0,
        proxy: Proxy | None = None,
    ) -> None:
        self._policy = policy
        self._proxy = None if proxy is None else URL(proxy.url)
        self._proxy_authorization: str | None = None
        self._destinations = None
        if proxy is not None:
            self._destinations = ProxiedDestinations(policy)
            if (credentials := proxy.credentials) is not None:
                self._proxy_authorization = aiohttp.encode_basic_auth(*credentials)
        self._verify = verify
        self._limit = limit
        self._connect_timeout = connect_timeout
        self._max_response_bytes = max_response_bytes
        self._keep_response_bytes = (
            max_response_bytes if keep_response_bytes is None else keep_response_bytes
        )
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the HTTP client has been closed")
        connector = guarded_connector(
            self._policy,
            verify=self._verify,
            limit=self._limit,
            keepalive_expiry=self._keepalive_expiry,
            connect_timeout=self._connect_timeout,
            proxied=self._proxy is not None,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=None, sock_connect=self._connect_timeout, sock_read=None
            ),
            trust_env=False,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            max_line_size=MAX_HEADER_LINE,
            max_field_size=MAX_HEADER_LINE,
        )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        read_limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Send one request; return its status, headers and body (at most
        ``keep_response_bytes`` of it)."""
        try:
            target = _url(url)
        except ValueError as exc:
            raise httpx.InvalidURL(str(exc)) from exc
        session = self._session or self._open()
        proxy_headers = None
        if self._destinations is not None and target.host is not None:
            await self._destinations.check(
                target.host, target.port or 0, within=self._connect_timeout
            )
            if self._proxy_authorization is not None:
                # on the CONNECT of a tunnel; on the request itself when the proxy
                # reads it (aiohttp sends proxy_headers only on a CONNECT)
                authorization = {"Proxy-Authorization": self._proxy_authorization}
                if target.scheme == "https":
                    proxy_headers = authorization
                else:
                    headers = {**headers, **authorization}
        try:
            response = await session.request(
                method,
                target,
                headers=headers,
                data=body,
                allow_redirects=False,
                ssl=True if tls is None else tls,
                proxy=self._proxy,
                proxy_headers=proxy_headers,
            )
            try:
                if read_limit is None:
                    limit, keep = self._max_response_bytes, self._keep_response_bytes
                else:
                    limit = keep = read_limit
                data = await _read_bounded(response.content, limit, keep)
            except BaseException:
                response.close()
                raise
            if response.content.at_eof():
                response.release()  # the connection goes back to the pool
            else:
                response.close()  # unread body: drop the connection
        except Exception as exc:
            mapped = httpx_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        return response.status, response.headers, data

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()


@lru_cache(maxsize=1024)
def _url(text: str) -> URL:
    """Parsed URLs, cached: a dispatcher sends to a few URLs many times."""
    return URL(text)


async def _read_bounded(content: aiohttp.StreamReader, limit: int, keep: int) -> bytes:
    """Read the body up to ``limit`` bytes and return its first ``keep`` (chunked
    framing removed, nothing decoded); what is read past ``keep`` is dropped at once."""
    kept: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await content.read(limit - size)
        if not chunk:
            break
        if size < keep:
            kept.append(chunk[: keep - size])
        size += len(chunk)
    return kept[0] if len(kept) == 1 else b"".join(kept)


def httpx_error(exc: Exception) -> Exception | None:
    """The httpx exception matching an aiohttp (or socket) error, or None to let ``exc``
    propagate unchanged (``BlockedDestination``, and anything unexpected).

    The message is aiohttp's, without the request's URL where aiohttp would add it
    (a query string may hold a token); the caller chains the original with
    ``raise ... from``.
    """
    if isinstance(exc, aiohttp.ClientResponseError):
        text = exc.message
    elif isinstance(exc, aiohttp.ConnectionTimeoutError) and exc.__cause__ is not None:
        # aiohttp wraps the timeout in a text naming the URL; the cause is ours or bare
        text = str(exc.__cause__) or "timed out connecting"
    elif isinstance(exc, aiohttp.InvalidURL):
        text = exc.description or "invalid URL"
    else:
        text = str(exc)
    text = text or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError):  # DNS, refused, TLS, certificate
        return httpx.ConnectError(text)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(text)
    if isinstance(exc, aiohttp.ClientResponseError):  # a response aiohttp could not parse
        return httpx.RemoteProtocolError(text)
    if isinstance(exc, aiohttp.NonHttpUrlClientError):
        return httpx.UnsupportedProtocol(text)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.InvalidURL(text)
    if isinstance(exc, OSError):  # ClientOSError, resets while sending or reading
        return httpx.ReadError(text)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return httpx.NetworkError(text)
    if isinstance(exc, aiohttp.ClientError):
        return httpx.TransportError(text)
    return None
