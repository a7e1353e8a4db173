"""Validation of new messages: pure functions, no I/O.

Every argument of :meth:`outbox.Outbox.enqueue` is checked here before any SQL is
sent, so bad input raises :class:`outbox.InvalidMessage` naming the field and the
caller's transaction is left untouched.

The module stays whole: it is the one list of what a message may hold, each
field's check beside the others.
"""

from __future__ import annotations

import functools
import ipaddress
import json as jsonlib
import re
import socket
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from outbox._digest import request_digest
from outbox.errors import InvalidMessage

DEFAULT_MAX_BODY_BYTES = 256 * 1024
MAX_ATTEMPTS_LIMIT = 1000
MAX_KEY_LENGTH = 255
MAX_URL_LENGTH = 2048
MAX_HEADERS = 64
MAX_HEADER_NAME = 256
MAX_HEADER_VALUE = 8192

EARLIEST_AVAILABLE_AT = datetime(2000, 1, 1, tzinfo=UTC)
"""The earliest ``available_at`` accepted (any time before now means "due now"; one
before this is a mistake, such as a date's year 1)."""

MAX_SCHEDULE_AHEAD = timedelta(days=3653)
"""How far ahead ``available_at`` may be: 10 years. Every time later derived from it
then fits PostgreSQL's timestamps and Python's datetimes."""

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})

# Headers the library or the HTTP layer owns. "content-type" is set through the
# content_type argument so that it always agrees with the body.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "idempotency-key",
    }
)
RESERVED_PREFIXES = ("webhook-",)

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# visible ASCII and space: safe in an HTTP header and in logs
_PRINTABLE = re.compile(r"^[\x20-\x7e]+\Z")
# header values: visible ASCII, space and tab
_HEADER_VALUE = re.compile(r"^[\x20-\x7e\t]*\Z")
_MEDIA_TYPE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+/[!#$%&'*+\-.^_`|~0-9A-Za-z]+(\s*;.*)?\Z")
# visible ASCII, no space: a URL as the dispatcher sends it
_URL_CHARS = re.compile(r"[\x21-\x7e]+")

# Built once: json.dumps with options other than its defaults makes a new encoder
# on every call. Bodies keep non-ASCII as UTF-8; headers are ASCII already.
_BODY_JSON = jsonlib.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_HEADERS_JSON = jsonlib.JSONEncoder(separators=(",", ":"))


class NewMessage(NamedTuple):
    """A validated message, ready to be written. (A named tuple: immutable, and
    made once per enqueue several times faster than a frozen dataclass.)"""

    idempotency_key: str
    target: str
    destination: str
    url: str | None
    endpoint_id: int | None
    method: str
    headers: dict[str, str]
    body: bytes
    content_type: str
    event_type: str | None
    ordering_key: str | None
    max_attempts: int
    available_at: datetime | None
    digest: bytes
    """What the request is (:mod:`outbox._digest`), stored with its key."""
    state: str = "ready"

    def params(self, trace_context: str | None = None) -> dict[str, Any]:
        """Parameters of the ``enqueue`` statement; ``trace_context`` is the
        enqueuing span's (:mod:`outbox._tracing`), None when none is recording."""
        return {
            "idempotency_key": self.idempotency_key,
            "target": self.target,
            "destination": self.destination,
            "endpoint_id": self.endpoint_id,
            "url": self.url,
            "method": self.method,
            "headers": _HEADERS_JSON.encode(self.headers) if self.headers else "{}",
            "body": self.body,
            "content_type": self.content_type,
            "event_type": self.event_type,
            "ordering_key": self.ordering_key,
            "state": self.state,
            "max_attempts": self.max_attempts,
            "available_at": self.available_at,
            "digest": self.digest,
            "trace_context": trace_context,
        }


def check_url(url: object, field: str = "url") -> str:
    """Return ``url`` if it is an absolute http(s) URL without credentials."""
    if not isinstance(url, str):
        raise InvalidMessage(field, f"must be a string, not {type(url).__name__}")
    if not url:
        raise InvalidMessage(field, "must not be empty")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidMessage(field, f"is longer than {MAX_URL_LENGTH} characters")
    problem = _parse_url(url).problem
    if problem is not None:
        raise InvalidMessage(field, problem)
    return url


def url_origin(url: str) -> str:
    """The destination of a message sent to ``url`` (checked by :func:`check_url`):
    its origin, ``scheme://host:port``, lower-cased and with the scheme's default
    port written out, so that every spelling of one server is one destination.
    The dispatcher shares its capacity fairly between destinations; migration
    0009 computes the same value in SQL for the rows written before it."""
    return _parse_url(url).origin


_DEFAULT_PORTS = {"http": 80, "https": 443}


class _ParsedUrl(NamedTuple):
    problem: str | None
    origin: str


@functools.lru_cache(maxsize=1024)
def _parse_url(url: str) -> _ParsedUrl:
    """What is wrong with ``url`` (at most MAX_URL_LENGTH characters), if anything,
    and its origin. Cached: applications send to a few URLs over and over, and
    parsing one costs more than all the other checks of a message."""
    if not _URL_CHARS.fullmatch(url):
        return _ParsedUrl("must not contain spaces, control or non-ASCII characters", "")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return _ParsedUrl(f"is not a valid URL ({exc})", "")
    scheme = parts.scheme.lower()
    problem = _parts_problem(url, parts.netloc, scheme, parts.hostname, port)
    if problem is not None or parts.hostname is None:
        return _ParsedUrl(problem, "")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return _ParsedUrl(None, f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}")


def _parts_problem(
    url: str, netloc: str, scheme: str, hostname: str | None, port: int | None
) -> str | None:
    """What is wrong with a URL that parsed into these parts, or None."""
    if scheme not in _DEFAULT_PORTS:
        return "must use the http or https scheme"
    if "@" in netloc:
        return "must not contain credentials (user:password@); use headers"
    if not hostname:
        return "must include a host"
    if "%" in hostname:
        return "must not percent-encode its host"
    problem = ipv4_host_problem(hostname)
    if problem is not None:
        return problem
    if port == 0:
        return "port 0 is not a valid destination"
    if "#" in url:  # an empty fragment ("...#") too: it is never sent either
        return "must not contain a fragment (#...); it is never sent"
    return None


_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0[xX][0-9a-fA-F]*)\Z")


def ipv4_host_problem(host: str) -> str | None:
    """What is wrong with ``host`` as an IPv4 address, or None if it is not one or
    is one in the canonical form (four decimal numbers, 127.0.0.1).

    A host whose last label is a number is an IPv4 address, as the WHATWG URL
    standard reads it: ``127.1``, ``2130706433``, ``017700000001`` and ``0x7f.1``
    all mean 127.0.0.1 to the C resolver, while other parsers refuse them or read
    them otherwise. The same URL must mean the same address to every client and to
    the SSRF guard, so only the canonical form is accepted.
    """
    labels = host.removesuffix(".").split(".")
    if ":" in host or not _NUMERIC_LABEL.match(labels[-1]):  # IPv6, or a name
        return None
    if host.count(".") == 3 and _is_ipv4(host):
        return None
    try:
        canonical = socket.inet_ntoa(socket.inet_aton(host.removesuffix(".")))
    except (OSError, ValueError):  # ValueError: a NUL character
        return f"host {host!r} is not a valid IPv4 address"
    return f"host {host!r} is an IPv4 address in a non-canonical form; write it {canonical}"


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def check_optional_key(value: object, field: str) -> str | None:
    """As :func:`check_key`, but None is allowed."""
    return None if value is None else check_key(value, field)


def check_key(value: object, field: str) -> str:
    """Return a printable key of 1-255 characters."""
    if not isinstance(value, str):
        raise InvalidMessage(field, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidMessage(field, "must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidMessage(field, f"is longer than {MAX_KEY_LENGTH} characters")
    if not _PRINTABLE.match(value):
        raise InvalidMessage(field, "must contain only printable ASCII characters")
    if value != value.strip(" "):
        raise InvalidMessage(field, "must not start or end with a space")
    return value


def check_method(method: object) -> str:
    """Return the upper-cased HTTP method if it is one the dispatcher sends."""
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise InvalidMessage("method", f"must be one of {', '.join(sorted(METHODS))}")
    return method.upper()


def check_headers(headers: object) -> dict[str, str]:
    """Return a copy of ``headers`` after checking names, values and reserved names."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidMessage("headers", "must be a mapping of header names to values")
    if len(headers) > MAX_HEADERS:
        raise InvalidMessage("headers", f"has more than {MAX_HEADERS} entries")
    seen: set[str] = set()
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidMessage("headers", "header names must be non-empty strings")
        shown = name if _PRINTABLE.match(name) else repr(name)
        if len(name) > MAX_HEADER_NAME or not _TOKEN.match(name):
            raise InvalidMessage(f"headers[{shown}]", "is not a valid HTTP header name")
        lower = name.lower()
        if lower in RESERVED_HEADERS or lower.startswith(RESERVED_PREFIXES):
            hint = " (use content_type=)" if lower == "content-type" else ""
            raise InvalidMessage(f"headers[{name}]", f"is set by the outbox itself{hint}")
        if lower in seen:
            raise InvalidMessage(f"headers[{name}]", "is given more than once")
        seen.add(lower)
        if not isinstance(value, str):
            raise InvalidMessage(f"headers[{name}]", "value must be a string")
        if len(value) > MAX_HEADER_VALUE:
            raise InvalidMessage(f"headers[{name}]", f"value is longer than {MAX_HEADER_VALUE}")
        if not _HEADER_VALUE.match(value):
            raise InvalidMessage(
                f"headers[{name}]",
                "value must be printable ASCII (no CR, LF or other control characters)",
            )
        out[name] = value
    return out


def encode_body(
    *, json: object, body: object, content_type: object, max_body_bytes: int
) -> tuple[bytes, str]:
    """Return the body bytes and content type from exactly one of ``json``/``body``."""
    if (json is None) == (body is None):
        raise InvalidMessage("json", "give exactly one of json= or body=")
    if json is not None:
        try:
            data = _BODY_JSON.encode(json).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidMessage("json", f"is not JSON serialisable ({exc})") from None
        default_type = "application/json"
        field = "json"
    elif isinstance(body, str):
        try:
            data = body.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessage("body", "is not valid Unicode text") from None
        default_type = "text/plain; charset=utf-8"
        field = "body"
    elif isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
        default_type = "application/octet-stream"
        field = "body"
    else:
        raise InvalidMessage("body", f"must be bytes or str, not {type(body).__name__}")
    if len(data) > max_body_bytes:
        raise InvalidMessage(
            field, f"is {len(data)} bytes, over the limit of {max_body_bytes} bytes"
        )
    if content_type is None:
        return data, default_type
    if (
        not isinstance(content_type, str)
        or len(content_type) > 255
        or not _HEADER_VALUE.match(content_type)
        or not _MEDIA_TYPE.match(content_type)
    ):
        raise InvalidMessage("content_type", "must be a media type such as application/json")
    return data, content_type


def check_max_attempts(value: object, default: int) -> int:
    """Return the attempt budget, ``default`` when None."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMessage("max_attempts", "must be an integer")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidMessage("max_attempts", f"must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value


def check_available_at(value: object) -> datetime | None:
    """Return an aware datetime (or None) from :data:`EARLIEST_AVAILABLE_AT` to
    :data:`MAX_SCHEDULE_AHEAD` from now."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidMessage("available_at", "must be a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidMessage(
            "available_at", "must be timezone-aware (naive datetimes are ambiguous)"
        )
    if value < EARLIEST_AVAILABLE_AT:
        raise InvalidMessage("available_at", f"must not be before {EARLIEST_AVAILABLE_AT:%Y-%m-%d}")
    if value > datetime.now(UTC) + MAX_SCHEDULE_AHEAD:
        raise InvalidMessage(
            "available_at", f"must be at most 10 years ({MAX_SCHEDULE_AHEAD.days} days) from now"
        )
    return value


def build_message(
    *,
    url: object,
    idempotency_key: object,
    json: object,
    body: object,
    content_type: object,
    method: object,
    headers: object,
    ordering_key: object,
    available_at: object,
    max_attempts: object,
    default_max_attempts: int,
    max_body_bytes: int,
) -> NewMessage:
    """Validate the arguments of ``enqueue`` and return the message to write."""
    checked_url = check_url(url)
    key = check_key(idempotency_key, "idempotency_key")
    data, ctype = encode_body(
        json=json, body=body, content_type=content_type, max_body_bytes=max_body_bytes
    )
    checked_method = check_method(method)
    checked_headers = check_headers(headers)
    return NewMessage(
        idempotency_key=key,
        target=checked_url,
        destination=url_origin(checked_url),
        url=checked_url,
        endpoint_id=None,
        method=checked_method,
        headers=checked_headers,
        body=data,
        content_type=ctype,
        event_type=None,
        ordering_key=check_optional_key(ordering_key, "ordering_key"),
        max_attempts=check_max_attempts(max_attempts, default_max_attempts),
        available_at=check_available_at(available_at),
        digest=request_digest(
            method=checked_method,
            url=checked_url,
            headers=checked_headers,
            content_type=ctype,
            body=data,
        ),
    )
