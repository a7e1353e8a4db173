"""HTTP delivery: one attempt of one claimed message, classified.

The sender never raises for a failed delivery: every response and every transport
error becomes an :class:`~dispatchers.outcome.Outcome`. It reads at most
``max_response_bytes`` of a response body, keeps a short excerpt of it, bounds
the whole attempt by ``request_timeout`` (httpx's timeouts are per operation, so a
trickling response could otherwise last forever) and never follows redirects.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from dispatchers.config import DispatcherConfig
from dispatchers.db import Job
from dispatchers.outcome import Outcome, Verdict, classify_exception, classify_response
from dispatchers.signing import webhook_headers
from dispatchers.ssrf import AddressPolicy, guarded_transport

TASKS_PER_CLIENT = 4
"""httpcore's pool scans every connection (with a readability probe each) per
request start and close, so its cost grows with the pool: a client per small
group of tasks keeps each pool small. Measured with benchmarks/drain.py: 4 tasks
per client used about half the CPU per message of 16."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt: its outcome, timing and a bounded response excerpt."""

    outcome: Outcome
    started_at: datetime
    duration_ms: int
    excerpt: str | None


def idempotency_header(key: str, form: str) -> str:
    """The ``Idempotency-Key`` value: an RFC 8941 string (``"..."``) or the raw key."""
    if form == "raw":
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Sender:
    """Sends claimed messages with pooled httpx clients.

    Webhook messages (those with an endpoint) are signed per Standard Webhooks
    at each attempt: ``webhook-id`` is the message's idempotency key (stable
    across retries and replays), ``webhook-timestamp`` the attempt's time, and
    ``webhook-signature`` one ``v1`` signature per secret in force.

    :param transport: an httpx transport to use instead of the guarded default
        (for tests, or a custom network stack); the SSRF guard is then the
        transport's business. A transport passed in is never closed here.
    """

    def __init__(
        self,
        config: DispatcherConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        timeout = httpx.Timeout(
            connect=config.connect_timeout,
            read=config.request_timeout,
            write=config.request_timeout,
            pool=config.request_timeout,
        )
        if transport is not None:
            self._clients = [self._client(transport, timeout)]
            self._owns_transports = False
        else:
            policy = AddressPolicy.from_strings(
                config.allow_networks, allow_private_networks=config.allow_private_networks
            )
            count = max(1, -(-config.concurrency // TASKS_PER_CLIENT))
            per_client = -(-config.concurrency // count)
            limits = httpx.Limits(
                max_connections=per_client,
                max_keepalive_connections=per_client,
                keepalive_expiry=30.0,
            )
            # one TLS context for every client: building one per client is costly
            tls: ssl.SSLContext | bool = (
                httpx.create_ssl_context(verify=True, trust_env=False)
                if config.verify_tls
                else False
            )
            self._clients = [
                self._client(guarded_transport(policy, verify=tls, limits=limits), timeout)
                for _ in range(count)
            ]
            self._owns_transports = True

    @staticmethod
    def _client(transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=transport, timeout=timeout, follow_redirects=False, trust_env=False
        )

    async def aclose(self) -> None:
        if self._owns_transports:
            for client in self._clients:
                await client.aclose()

    def request_headers(self, job: Job) -> dict[str, str]:
        headers = dict(job.headers)
        headers["Content-Type"] = job.content_type
        headers["Idempotency-Key"] = idempotency_header(
            job.idempotency_key, self.config.idempotency_key_format
        )
        headers.setdefault("User-Agent", self.config.user_agent)
        headers.setdefault("Accept-Encoding", "identity")
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
        started_at = datetime.now(UTC)
        start = time.monotonic()
        client = self._clients[job.id % len(self._clients)]
        excerpt: str | None = None
        try:
            async with asyncio.timeout(self.config.request_timeout):
                request = client.build_request(
                    job.method, job.url, content=job.body, headers=self.request_headers(job)
                )
                response = await client.send(request, stream=True)
                try:
                    body = await self._read_bounded(response)
                finally:
                    await response.aclose()
            outcome = classify_response(
                response.status_code,
                response.headers,
                now=datetime.now(UTC),
                retry_statuses=self.config.retry_statuses,
            )
            if self.config.excerpt_bytes and body:
                excerpt = body[: self.config.excerpt_bytes].decode("utf-8", errors="replace")
        except TimeoutError:
            outcome = Outcome(
                verdict=Verdict.RETRY,
                status=None,
                error=f"no complete response within {self.config.request_timeout:g} s",
                error_class="timeout",
                retry_after=None,
            )
        except Exception as exc:
            outcome = classify_exception(exc)
        duration_ms = int((time.monotonic() - start) * 1000)
        return Attempt(outcome, started_at, duration_ms, excerpt)

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        """Read up to ``max_response_bytes`` of the body; the rest is never read
        (closing the response then drops the connection instead of reusing it)."""
        limit = self.config.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                size += len(chunk)
                if size >= limit:
                    break
        except httpx.StreamConsumed:
            # a transport that returns an already-read response (such as
            # httpx.MockTransport): the body is in memory, nothing to bound
            return response.content[:limit]
        return b"".join(chunks)[:limit]
