"""Dispatcher settings: one value object, validated as a whole at start-up.

A setting is defined once, here, with its default and its option
(:func:`option`); every number has a bound (:data:`MAX_SECONDS`,
:data:`~outbox.defaults.MAX_SPAN`, :data:`MAX_COUNT`) so that no derived time
overflows PostgreSQL's timestamps or Python's datetimes.

The module stays whole past the usual length: it is the one place where every
setting is defined, and a setting defined elsewhere would be defined twice.

Design: docs/explanation/design/config.md
"""

from __future__ import annotations

import ipaddress
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal

from dispatchers.delivery.proxy import Proxy
from dispatchers.delivery.retry import STANDARD_WEBHOOKS_SCHEDULE, ExponentialBackoff, RetryPolicy
from dispatchers.delivery.settings import BreakerSettings
from dispatchers.runtime.loop import EVENT_LOOPS
from outbox.defaults import DEFAULT_SCHEMA, MAX_SPAN
from outbox.errors import ConfigurationError
from outbox.internal import check_schema_name
from outbox.sealing import Keyring

LEASE_BUDGET_FACTOR = 1.5
"""The lease must be this many times the longest a delivery can take to finish and
be recorded (request timeout + flush interval + statement timeout), so a delivery
never outlives its lease even when every heartbeat in between fails."""


MAX_SECONDS = 7 * 24 * 3600.0
"""The longest time a setting in seconds may be (a week): a lease, a timeout, an
interval, the grace period. PostgreSQL's own timeouts stop at 24.8 days (whole
milliseconds in a 32-bit integer); a week past now fits every datetime."""

MIN_RETENTION = 3600.0
"""The shortest ``--retention`` (an hour): the schema's functions that drop history
and keys refuse less (migration 0034), so that the dispatcher's role cannot erase
every idempotency key at once."""

LOOPBACK_NETWORKS = ("127.0.0.0/8", "::1/128")
"""The networks :attr:`DispatcherConfig.embedded_database` allows: this machine only."""

MAX_COUNT = 1_000_000_000
"""The largest count or size in bytes a setting may be (a billion): fits a 32-bit
integer, and any ``LIMIT``."""

MAX_NUMBER = 1e9
"""The largest value of a number without a bound of its own (a rate, a factor)."""

HTTP_CLIENTS = ("httpx", "aiohttp")
"""The HTTP clients a dispatcher can send with (``DispatcherConfig.http_client``)."""

HISTORY_PARTITIONS = ("hour", "day", "week")
"""The ranges of the history's partitions (``history_partition``), each aligned on
its boundary in UTC."""

IDEMPOTENCY_KEY_FORMATS = ("structured", "raw")
"""How the ``Idempotency-Key`` header carries a key (``idempotency_key_format``)."""

Values = Literal["count", "seconds", "seconds_or_zero", "span", "port", "proxy", "ratio", "text"]
"""What an option's argument is: ``count`` an integer from 1 to :data:`MAX_COUNT`;
``seconds`` a finite number above 0, at most :data:`MAX_SECONDS`;
``seconds_or_zero`` the same or 0; ``span`` a whole number of units such as ``7d``,
at most :data:`~outbox.defaults.MAX_SPAN`; ``port`` an integer from 0 to 65535; ``proxy`` a
proxy URL (:meth:`~dispatchers.delivery.proxy.Proxy.parse`); ``ratio`` a number above 0 and
at most 1; ``text`` a string (with ``choices``, one of them)."""


@dataclass(frozen=True)
class Option:
    """How a setting appears on the ``outbox dispatch`` command line (made by
    :func:`option`).

    The flag is ``--`` and the field's name with dashes, unless ``flag`` names it.
    A boolean setting is a flag without an argument: ``--name`` when it defaults to
    False, ``--no-name`` when it defaults to True. A tuple setting is repeatable:
    each use adds one item. ``help`` is completed by the field's default, or by
    ``default`` where the field's is derived from other settings.
    """

    help: str
    values: Values
    metavar: str | None
    choices: tuple[str, ...] | None
    flag: str | None
    default: str | None


def kind(values: Values) -> dict[str, Values]:
    """Field metadata that says what a setting offered on no command line holds
    (an option's :class:`Option` says it for the option's setting)."""
    return {"kind": values}


def kind_of(setting: Field[Any]) -> Values | None:
    """What ``setting`` holds, as its option or its :func:`kind` says; None when
    neither does (its own checks in :meth:`DispatcherConfig.validate`)."""
    offered = setting.metadata.get("option")
    return offered.values if offered is not None else setting.metadata.get("kind")


def option(
    help: str,
    *,
    values: Values = "text",
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    flag: str | None = None,
    default: str | None = None,
) -> dict[str, Option]:
    """Field metadata that offers a setting as an ``outbox dispatch`` option."""
    return {"option": Option(help, values, metavar, choices, flag, default)}


@dataclass(frozen=True)
class DispatcherConfig:
    """Every knob of a dispatcher process. Times are in seconds.

    ``http_client`` chooses the client that sends: ``"aiohttp"`` (the default: a
    quarter of httpx's CPU per request) or ``"httpx"``, both behind the SSRF guard
    (see :mod:`dispatchers.delivery.http`).
    ``event_loop`` is the loop :func:`~dispatchers.runtime.dispatcher.run_dispatcher` runs on:
    ``"auto"`` (uvloop when it can be imported, else asyncio's), ``"asyncio"`` or
    ``"uvloop"`` (see :mod:`dispatchers.runtime.loop`).
    ``prepared_statements`` prepares the dispatcher's statements on each server
    connection as needed (SQL ``PREPARE``, sent with the first execution), so they
    are planned once per connection; a pooler that moves the dispatcher to another
    server connection only costs a re-prepare.
    ``claim_window`` is the shortest time between two claims of a dispatcher while
    messages trickle in (they are claimed together; 0 claims on every
    notification, for the lowest latency at the highest cost); see
    :mod:`dispatchers.runtime.cadence`.
    ``lease`` is renewed every ``lease / 3``; a permanent database error that
    persists for a lease stops the dispatcher, and a drain stops after
    ``drain_timeout`` without progress (see :mod:`dispatchers.runtime.watchdog`).
    ``destination_concurrency`` bounds the requests in flight to one destination
    (None: ``concurrency`` less a quarter, see :attr:`per_destination`); claims
    share the free capacity across destinations in turns (``claim`` in
    ``dispatchers/store/sql/claim.sql``).
    ``batch_size`` bounds one claim statement; a dispatcher claims at most its free
    capacity (``concurrency`` minus deliveries in flight or awaiting their outcome
    write).
    ``proxy`` sends every delivery through a forward proxy (see
    :mod:`dispatchers.delivery.proxy`); none is ever taken from the environment.
    ``keyring`` opens signing secrets sealed at rest (see :mod:`outbox.sealing`);
    it must hold every key that seals a secret in force (checked at start-up by
    :mod:`dispatchers.store.preflight`).
    """

    schema: str = DEFAULT_SCHEMA
    concurrency: int = field(
        default=64,
        metadata=option(
            "HTTP requests in flight at once; messages awaiting their outcome write "
            "stay leased too, up to as many again",
            values="count",
        ),
    )
    destination_concurrency: int | None = field(
        default=None,
        metadata=option(
            "HTTP requests in flight at once to one destination (a webhook endpoint, "
            "or the scheme, host and port of a URL), so that a slow or hanging "
            "destination cannot take every request slot",
            values="count",
            default="--concurrency less a quarter, at least 1",
        ),
    )
    batch_size: int = field(
        default=100,
        metadata=option("most messages claimed by one statement", values="count"),
    )
    lease: float = field(
        default=30.0,
        metadata=option("lease length in seconds, renewed every third", values="seconds"),
    )
    request_timeout: float = field(
        default=10.0,
        metadata=option(
            "bound on one HTTP attempt, connect to last byte, in seconds", values="seconds"
        ),
    )
    connect_timeout: float = field(
        default=5.0,
        metadata=option(
            "bound on opening a connection, in seconds; at most --request-timeout",
            values="seconds",
        ),
    )
    flush_interval: float = field(default=0.05, metadata=kind("seconds"))
    flush_batch: int = field(default=500, metadata=kind("count"))
    grace: float = field(
        default=10.0,
        metadata=option("seconds in-flight deliveries get at shutdown", values="seconds_or_zero"),
    )
    poll_interval: float = field(
        default=1.0,
        metadata=option("seconds between polls when no notification arrives", values="seconds"),
    )
    claim_window: float = field(
        default=0.005,
        metadata=option(
            "shortest seconds between two claims while messages keep arriving: what "
            "arrives within it is claimed together, which costs the database less per "
            "message and adds up to this much latency; 0 claims on every notification",
            values="seconds_or_zero",
        ),
    )
    listen: bool = field(
        default=True,
        metadata=option(
            "do not LISTEN for enqueue notifications; poll only "
            "(needed behind PgBouncer in transaction mode)"
        ),
    )
    prepared_statements: bool = field(
        default=True,
        metadata=option(
            "plan every statement at every execution instead of once per server "
            "connection (prepared statements also work behind PgBouncer: a statement "
            "missing on a server connection is prepared again)"
        ),
    )
    rescue_interval: float = field(default=5.0, metadata=kind("seconds"))
    drain_timeout: float = field(
        default=60.0,
        metadata=option(
            "with --drain, exit 1 after this many seconds without progress (nothing "
            "claimed, recorded or rescued, and the work left unchanged); keep it above "
            "the lease, which a stopped dispatcher's messages wait out",
            values="seconds",
        ),
    )
    claim_timeout: float = field(
        default=2.0,
        metadata=option("bound on the claim statement, in seconds", values="seconds"),
    )
    statement_timeout: float = field(
        default=3.0,
        metadata=option("bound on every other statement, in seconds", values="seconds"),
    )
    lock_timeout: float = field(
        default=1.0,
        metadata=option("bound on waiting for a row lock, in seconds", values="seconds"),
    )
    idle_in_transaction_timeout: float = field(default=5.0, metadata=kind("seconds"))
    db_connect_timeout: float = field(default=5.0, metadata=kind("seconds"))
    max_response_bytes: int = field(default=64 * 1024, metadata=kind("count"))
    excerpt_bytes: int = 1024
    allow_private_networks: bool = field(
        default=False,
        metadata=option("turn the SSRF guard off: allow loopback and private addresses"),
    )
    allow_networks: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "allow this non-public network (repeatable), e.g. 10.0.0.0/8",
            metavar="CIDR",
            flag="--allow-network",
        ),
    )
    verify_tls: bool = True
    embedded_database: bool = False
    """The database is the embedded development server (no URL was given, see
    :func:`dispatchers.embedded.resolve`): loopback destinations
    (:data:`LOOPBACK_NETWORKS`) are allowed, so that a receiver on this machine
    works on the first try. Never inferred from a URL."""
    blocked_delay: float = field(default=60.0, metadata=kind("seconds"))
    """Seconds a message whose destination the SSRF guard refused waits, unsent and
    its attempt refunded, before it is claimed again (see
    :func:`dispatchers.runtime.completions.blocked`)."""
    proxy: Proxy | None = field(
        default=None,
        metadata=option(
            "send every delivery through this HTTP forward proxy, "
            "http://[user:password@]host:port (CONNECT for https destinations); the "
            "SSRF guard still checks each destination; OUTBOX_PROXY sets it too",
            values="proxy",
            metavar="URL",
        ),
    )
    idempotency_key_format: str = field(
        default="structured",
        metadata=option(
            'Idempotency-Key as an RFC 8941 string ("key", per the IETF draft) or the raw key',
            choices=IDEMPOTENCY_KEY_FORMATS,
        ),
    )
    user_agent: str = "outbox-dispatcher"
    http_client: str = field(
        default="aiohttp",
        metadata=option(
            "HTTP client that sends, both behind the SSRF guard; aiohttp costs about a "
            "quarter of httpx's CPU per request",
            choices=HTTP_CLIENTS,
        ),
    )
    event_loop: str = field(
        default="auto",
        metadata=option(
            "event loop to run on: uvloop (about 7% less CPU per delivery; "
            "pip install 'pg-outbox[fast]') or asyncio's own; auto uses uvloop when it is "
            "installed",
            choices=EVENT_LOOPS,
        ),
    )
    retry_policy: RetryPolicy = field(default_factory=ExponentialBackoff)
    retry_statuses: frozenset[int] = frozenset({408, 425, 429})
    disable_after: float = field(default=5 * 24 * 3600.0, metadata=kind("span"))
    retention: float = field(
        default=7 * 24 * 3600.0,
        metadata=option(
            "keep delivered messages and attempts this long, then drop them a whole "
            "partition at a time (the history before the partitioning goes in small "
            "batches); idempotency keys and event records are kept at least this "
            "long, at most about twice, and dropped a whole generation at a time; "
            "dead messages are kept until purged, their attempts as long as the rest",
            values="span",
            metavar="SPAN",
        ),
    )
    retention_interval: float = field(default=60.0, metadata=kind("seconds"))
    retention_batch: int = field(default=5000, metadata=kind("count"))
    history_partition: str = field(
        default="day",
        metadata=option(
            "the range of each partition of the history (delivered, attempts) made "
            "from now on; history is dropped a partition at a time, so it is kept up "
            "to this much past --retention",
            choices=HISTORY_PARTITIONS,
        ),
    )
    history_ahead: float = field(
        default=3 * 24 * 3600.0,
        metadata=option(
            "make the history's partitions this far ahead, at start and every minute; "
            "what no partition covers goes to a default one, and is moved out when "
            "its partition is made",
            values="span",
            metavar="SPAN",
        ),
    )
    #: how often the backlog is read, for the gauges of /metrics and for --lag-alert
    #: (with either only)
    backlog_interval: float = field(default=15.0, metadata=kind("seconds"))
    #: the destinations named in the backlog gauges; the rest are "(other)"
    backlog_destinations: int = field(default=20, metadata=kind("count"))
    lag_alert: float | None = field(
        default=None,
        metadata=option(
            "raise the alert outbox.lag.exceeded when the oldest message due has waited "
            "longer than this, and outbox.lag.recovered once it waits half as long or "
            "less; each once per crossing, whichever dispatcher sees it first (checked "
            "every 15 s)",
            values="span",
            metavar="SPAN",
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=option(
            "serve Prometheus /metrics, /healthz (200 while the database answers, "
            "else 503) and /livez (200 while the process runs) on this port; 0 picks "
            "a free one (the started event names it); with --processes N, process i "
            "serves on PORT+i",
            values="port",
            metavar="PORT",
        ),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=option("address for --metrics-port; 0.0.0.0 in a container"),
    )
    webhook_retry_policy: RetryPolicy = field(default_factory=lambda: STANDARD_WEBHOOKS_SCHEDULE)
    retry_after_holds: bool = field(
        default=True,
        metadata=option(
            "let a 429 or 503 with Retry-After delay only the message that got it, "
            "instead of holding its whole destination until then"
        ),
    )
    breaker_window: float = field(
        default=30.0,
        metadata=option(
            "circuit breaker: seconds of a destination's recent attempts that its "
            "failure ratio is taken over (5xx, 408, 429, timeouts and connection errors "
            "fail; other 4xx answers do not)",
            values="seconds",
        ),
    )
    breaker_min_attempts: int = field(
        default=10,
        metadata=option(
            "circuit breaker: fewest attempts in the window on which a destination's "
            "breaker may open",
            values="count",
        ),
    )
    breaker_failure_ratio: float = field(
        default=0.5,
        metadata=option(
            "circuit breaker: share of failed attempts in the window (above 0, at most "
            "1) that opens a destination's breaker: its messages wait, their attempts "
            "unspent, until one probe request succeeds",
            values="ratio",
        ),
    )
    breaker_backoff: float = field(
        default=5.0,
        metadata=option(
            "circuit breaker: seconds an opened breaker waits before its probe request; "
            "doubled by each failed probe in a row",
            values="seconds",
        ),
    )
    breaker_backoff_max: float = field(
        default=300.0,
        metadata=option(
            "circuit breaker: longest wait between two probes, in seconds", values="seconds"
        ),
    )
    keyring: Keyring | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def renew_interval(self) -> float:
        return self.lease / 3

    @property
    def per_destination(self) -> int:
        """Requests in flight to one destination at most while others have messages
        ready: ``destination_concurrency``, or ``concurrency`` less a quarter (at
        least one slot), which is left for the other destinations when one of them
        hangs until the request timeout. A destination alone with ready messages
        is held to it only once it is at it: below it, claims give it the whole
        batch, as no other needs the room, and claims of the few messages its
        bound frees at a time would cost it a round trip each (a claim costs the
        database about the same whatever it takes)."""
        if self.destination_concurrency is not None:
            return self.destination_concurrency
        return max(1, self.concurrency - max(1, self.concurrency // 4))

    @property
    def allowed_networks(self) -> tuple[str, ...]:
        """The non-public networks the SSRF guard admits: ``allow_networks``, and
        loopback on the embedded development database."""
        if not self.embedded_database:
            return self.allow_networks
        return (
            *self.allow_networks,
            *(n for n in LOOPBACK_NETWORKS if n not in self.allow_networks),
        )

    @property
    def ssrf_guard(self) -> str:
        """The SSRF guard as the ``started`` event describes it."""
        if self.allow_private_networks:
            return "off (--allow-private-networks): every address allowed"
        allowed = self.allowed_networks
        if not allowed:
            return "on: public addresses only (others: --allow-network CIDR)"
        text = "on: public addresses and " + ", ".join(allowed)
        if self.embedded_database:
            text += " (loopback: the embedded development database)"
        return text

    @property
    def breaker(self) -> BreakerSettings:
        """The ``breaker_*`` settings, for :class:`~dispatchers.delivery.health.HealthBook`."""
        return BreakerSettings(
            window=self.breaker_window,
            min_attempts=self.breaker_min_attempts,
            failure_ratio=self.breaker_failure_ratio,
            backoff=self.breaker_backoff,
            backoff_max=self.breaker_backoff_max,
        )

    @property
    def completion_budget(self) -> float:
        """Longest time from claim to a recorded outcome when nothing renews."""
        return self.request_timeout + self.flush_interval + self.statement_timeout

    def validate(self) -> None:
        """Raise ConfigurationError naming the first setting that cannot work."""
        check_schema_name(self.schema)
        kinds: dict[str, list[str]] = {}
        for setting in fields(self):
            if setting.default is not None:  # one that may be None checks itself
                kinds.setdefault(kind_of(setting) or "text", []).append(setting.name)
        for name in kinds.get("count", ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"{name}: must be an integer, got {value!r}")
            if not 1 <= value <= MAX_COUNT:
                raise ConfigurationError(f"{name}: must be from 1 to {MAX_COUNT}")
        if self.destination_concurrency is not None and (
            isinstance(self.destination_concurrency, bool)
            or not isinstance(self.destination_concurrency, int)
            or not 1 <= self.destination_concurrency <= MAX_COUNT
        ):
            raise ConfigurationError(
                f"destination_concurrency: must be an integer from 1 to {MAX_COUNT}, or None "
                "for concurrency less a quarter"
            )
        if self.excerpt_bytes < 0 or self.excerpt_bytes > self.max_response_bytes:
            raise ConfigurationError("excerpt_bytes: must be between 0 and max_response_bytes")
        for values, zero, most in (
            ("seconds", False, MAX_SECONDS),
            ("seconds_or_zero", True, MAX_SECONDS),
            ("span", False, MAX_SPAN),
        ):
            for name in kinds.get(values, ()):
                _check_seconds(name, getattr(self, name), zero=zero, most=most)
        if (
            isinstance(self.breaker_failure_ratio, bool)
            or not isinstance(self.breaker_failure_ratio, int | float)
            or not 0 < self.breaker_failure_ratio <= 1
        ):
            raise ConfigurationError("breaker_failure_ratio: must be a number above 0, at most 1")
        if self.breaker_backoff > self.breaker_backoff_max:
            raise ConfigurationError("breaker_backoff: must not exceed breaker_backoff_max")
        if self.retention < MIN_RETENTION:
            raise ConfigurationError(
                f"retention: must be at least {MIN_RETENTION / 3600:g}h, got {self.retention:g} s"
            )
        if self.lag_alert is not None:
            _check_seconds("lag_alert", self.lag_alert, zero=False, most=MAX_SPAN)
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError("metrics_port: must be between 0 and 65535")
        if not 0 <= self.claim_window <= self.poll_interval:
            raise ConfigurationError(
                "claim_window: must be a number of seconds from 0 (claim on every "
                "notification) to poll_interval"
            )
        if self.connect_timeout > self.request_timeout:
            raise ConfigurationError("connect_timeout: must not exceed request_timeout")
        needed = LEASE_BUDGET_FACTOR * self.completion_budget
        if self.lease < needed:
            raise ConfigurationError(
                f"lease: {self.lease:g} s is too short. A delivery may take up to the request "
                f"timeout ({self.request_timeout:g} s) plus the flush interval "
                f"({self.flush_interval:g} s) plus the statement timeout "
                f"({self.statement_timeout:g} s) to be recorded, and the lease must be at "
                f"least {LEASE_BUDGET_FACTOR:g}x that ({needed:g} s), or duplicates are "
                "certain under load. Raise --lease or lower --request-timeout."
            )
        for name in ("claim_timeout", "statement_timeout", "lock_timeout"):
            if getattr(self, name) * 3 > self.lease:
                raise ConfigurationError(f"{name}: must be at most a third of the lease")
        if self.idempotency_key_format not in IDEMPOTENCY_KEY_FORMATS:
            raise ConfigurationError(
                "idempotency_key_format: must be 'structured' (an RFC 8941 string, as the "
                "IETF Idempotency-Key draft specifies) or 'raw'"
            )
        if self.http_client not in HTTP_CLIENTS:
            raise ConfigurationError(
                f"http_client: must be one of {', '.join(map(repr, HTTP_CLIENTS))}, "
                f"got {self.http_client!r}"
            )
        if self.history_partition not in HISTORY_PARTITIONS:
            raise ConfigurationError(
                f"history_partition: must be one of {', '.join(map(repr, HISTORY_PARTITIONS))}, "
                f"got {self.history_partition!r}"
            )
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigurationError(
                f"event_loop: must be one of {', '.join(map(repr, EVENT_LOOPS))}, "
                f"got {self.event_loop!r}"
            )
        if self.proxy is not None and not isinstance(self.proxy, Proxy):
            raise ConfigurationError("proxy: must be a Proxy (Proxy.parse(url)) or None")
        for cidr in self.allow_networks:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ConfigurationError(
                    f"allow_networks: {cidr!r} is not a CIDR ({exc})"
                ) from None


def _check_seconds(name: str, value: object, *, zero: bool, most: float) -> None:
    """Raise ConfigurationError unless ``value`` is a finite number of seconds above
    0 (or 0, with ``zero``) and at most ``most``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value >= 0 if zero else value > 0)
        or not value <= most  # also refuses nan and inf
    ):
        least = "0 or more" if zero else "above 0"
        raise ConfigurationError(
            f"{name}: must be a finite number of seconds, {least} and at most {most:g}"
        )
