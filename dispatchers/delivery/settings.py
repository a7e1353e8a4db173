"""What delivery reads of a dispatcher's settings.

The settings belong to the runtime (:class:`~dispatchers.runtime.config.
DispatcherConfig` has every one of these); delivery names only the ones it uses,
so that it depends on nothing above it. Times are in seconds. Light to import
(no HTTP client): the runtime's settings are read before anything sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dispatchers.delivery.proxy import Proxy


class SendSettings(Protocol):
    """The settings of a :class:`~dispatchers.delivery.http.Sender` and its clients."""

    @property
    def concurrency(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def request_timeout(self) -> float: ...
    @property
    def max_response_bytes(self) -> int: ...
    @property
    def excerpt_bytes(self) -> int: ...
    @property
    def allowed_networks(self) -> tuple[str, ...]:
        """The non-public networks the SSRF guard admits."""
        ...

    @property
    def allow_private_networks(self) -> bool: ...
    @property
    def verify_tls(self) -> bool: ...
    @property
    def proxy(self) -> Proxy | None: ...
    @property
    def idempotency_key_format(self) -> str: ...
    @property
    def user_agent(self) -> str: ...
    @property
    def http_client(self) -> str: ...
    @property
    def retry_statuses(self) -> frozenset[int]: ...


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """When a destination's circuit breaker opens, and how long it stays open
    before a probe (see :mod:`dispatchers.delivery.health`; the defaults are
    :class:`DispatcherConfig`'s ``breaker_*``).

    :param window: seconds of recent attempts the failure ratio is taken over.
    :param min_attempts: no breaker opens on fewer attempts in the window.
    :param failure_ratio: the share of failed attempts (above 0, at most 1) that
        opens it.
    :param backoff: seconds an opened breaker waits before its probe; each failed
        probe in a row doubles it,
    :param backoff_max: up to this.
    """

    window: float
    min_attempts: int
    failure_ratio: float
    backoff: float
    backoff_max: float
