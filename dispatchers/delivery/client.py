"""The HTTP client as the sender and the OAuth2 token fetcher use it: a
:class:`~typing.Protocol` that both clients (httpx's and aiohttp's, in
:mod:`dispatchers.delivery.http`) meet."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Protocol


class HttpClient(Protocol):
    """What the sender needs of an HTTP client.

    :meth:`request` sends one request and returns its status, headers and body
    (at most the configured bound of it); it raises httpx's exception types for
    transport failures (``BlockedDestination`` for a refused destination), which
    :func:`~dispatchers.delivery.outcome.classify_exception` understands. ``tls``, when
    given, is the destination's own TLS context (its CA bundle, its client
    certificate: :mod:`dispatchers.delivery.tls`), used instead of the default one, on
    connections of its own. ``read_limit``, when given, is the most of the body to
    read, all of it returned (an OAuth2 token response is read so, see
    :mod:`dispatchers.delivery.oauth2`), instead of the configured bound of which
    only an excerpt is kept. The sender bounds the whole call by ``request_timeout``.
    """

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        read_limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]: ...

    async def aclose(self) -> None: ...
