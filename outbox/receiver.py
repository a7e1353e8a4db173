"""The receiving half: verify Standard Webhooks signatures, dedupe inside your transaction.

A receiver verifies (:func:`verify`, raising ``InvalidSignature``), then claims the
key in the transaction that applies the effect, so each key's effect happens
exactly once in its database. With OpenTelemetry, :func:`extract_context` joins
the receiver's span to the enqueuing transaction's trace.

Design: docs/explanation/design/receiver.md
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from psycopg import sql

from outbox._message import check_key
from outbox._queries import check_schema_name, queries_for
from outbox._transaction import Plan, run_async, run_sync, scalar, sqlstate
from outbox.errors import ConfigurationError, InvalidArgument, InvalidMessage, InvalidSignature
from outbox.secrets import parse_secret, signature

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = [
    "DEFAULT_INBOX_SCHEMA",
    "DEFAULT_TOLERANCE",
    "Inbox",
    "InvalidSignature",
    "extract_context",
    "idempotency_key",
    "verify",
]

DEFAULT_TOLERANCE = 300.0
DEFAULT_INBOX_SCHEMA = "outbox_inbox"

_TIMESTAMP = re.compile(r"^(?:0|[1-9][0-9]{0,11})\Z")
"""Whole seconds as a sender writes them: ASCII digits, no sign, no leading zero,
at most 12 of them (beyond any tolerance, and cheap to convert)."""
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}\Z")
# RFC 8941 sf-string: printable ASCII in double quotes; only \" and \\ escapes
_SF_STRING = re.compile(r'^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"\Z')
_SF_UNESCAPE = re.compile(r"\\([\"\\])")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name``, looked up case-insensitively.

    The same name given twice (in different cases) with different values is
    ambiguous, so it is rejected rather than resolved either way.
    """
    values = {value for key, value in headers.items() if key.lower() == name}
    if len(values) > 1:
        raise InvalidSignature(f"conflicting {name} headers")
    return values.pop() if values else None


def _required(headers: Mapping[str, str], name: str) -> str:
    value = _header(headers, name)
    if not value:
        raise InvalidSignature(f"missing {name} header")
    return value


def _keys(secret_or_secrets: str | Sequence[str]) -> list[bytes]:
    if isinstance(secret_or_secrets, str):
        return [parse_secret(secret_or_secrets)]
    if not isinstance(secret_or_secrets, Sequence) or not secret_or_secrets:
        raise InvalidMessage("secret", "give one secret or a non-empty sequence of them")
    return [parse_secret(secret) for secret in secret_or_secrets]


def _v1_signatures(listed: str) -> Iterator[bytes]:
    """The decoded ``v1`` signatures of a ``webhook-signature`` value.

    Entries are separated by spaces, as the spec writes them (so a tab or a
    newline does not separate two entries); an empty entry, one of another
    version, and one that is not ``v1,`` followed by standard base64 with its
    padding are skipped, so that garbage beside a valid signature neither hides
    it nor counts.
    """
    for entry in listed.split(" "):
        version, comma, encoded = entry.partition(",")
        if version != "v1" or not comma or not _BASE64.match(encoded):
            continue
        try:
            yield base64.b64decode(encoded, validate=True)
        except binascii.Error:  # missing padding
            continue


def verify(
    secret_or_secrets: str | Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check a request's Standard Webhooks signature; raise :class:`InvalidSignature` if bad.

    ``body`` is the raw request body, byte for byte as received (it need not be
    UTF-8). ``headers`` is any mapping (its names are matched case-insensitively).
    The request passes if any ``v1`` signature it lists matches any of the
    secrets, compared in constant time; entries of other versions, and malformed
    entries, are skipped. Its timestamp must be within ``tolerance`` seconds of
    ``now`` (default: the current time). A malformed secret raises
    :class:`outbox.InvalidMessage`, as it is the receiver's configuration that is
    wrong, not the request.

    It gives the verdict of the reference ``standardwebhooks`` library wherever
    that library gives one, and is stricter by design where the library reads
    leniently what was not signed as such:

    - ``webhook-timestamp`` must be written as it was signed, in ASCII digits
      with no sign, leading zero, fraction or spaces (the reference reads it as a
      float and checks the signature over its whole seconds, so ``+1700000000``
      or ``1700000000.9`` pass it when ``1700000000`` was signed);
    - each signature must be standard base64 with its padding (the reference
      skips characters outside the alphabet and ignores data after the padding);
    - a header given twice, spelt differently, with different values is rejected
      (the reference takes the last one);
    - ``body`` must be bytes, where the reference also takes a ``str``: text
      decoded by a framework is not what was signed.

    Where the reference raises an error of another kind (an entry with no comma
    or a bad padding before the matching one, a body that is not UTF-8), it gives
    no verdict; ``verify`` skips such entries and checks such bodies as bytes.
    """
    keys = _keys(secret_or_secrets)
    if not isinstance(body, bytes):
        raise TypeError(f"body must be the raw request bytes, not {type(body).__name__}")
    if tolerance < 0:
        raise ConfigurationError("tolerance: must not be negative")
    msg_id = _required(headers, "webhook-id")
    stamp = _required(headers, "webhook-timestamp")
    listed = _required(headers, "webhook-signature")
    if not _TIMESTAMP.match(stamp):
        raise InvalidSignature(
            "webhook-timestamp is not an integer number of seconds in decimal digits"
        )
    current = time.time() if now is None else now
    if int(stamp) < current - tolerance:
        raise InvalidSignature("webhook-timestamp is too old")
    if int(stamp) > current + tolerance:
        raise InvalidSignature("webhook-timestamp is too far in the future")
    try:
        expected = [signature(key, msg_id=msg_id, timestamp=stamp, body=body) for key in keys]
    except UnicodeEncodeError:  # a lone surrogate: no sender could have signed it
        raise InvalidSignature("webhook-id is not valid text") from None
    matched = False
    for given in _v1_signatures(listed):
        for digest in expected:
            matched |= hmac.compare_digest(digest, given)
    if not matched:
        raise InvalidSignature("no signature matches")


def idempotency_key(headers: Mapping[str, str]) -> str | None:
    """The request's ``Idempotency-Key`` header, or None if it has none.

    An RFC 8941 string (``"abc"``, with ``\\"`` and ``\\\\`` escapes, as the
    dispatcher sends it by default) is unwrapped; any other value is returned
    as is, less surrounding spaces. A malformed quoted value raises
    :class:`outbox.InvalidMessage`.

    For Standard Webhooks deliveries the ``webhook-id`` header is the natural
    dedupe key: it is the same on every retry of a message, and it is covered by
    the signature, which ``Idempotency-Key`` is not.
    """
    values = {value for key, value in headers.items() if key.lower() == "idempotency-key"}
    if len(values) > 1:
        raise InvalidMessage("Idempotency-Key", "given more than once with different values")
    if not values:
        return None
    value = values.pop().strip(" \t")
    if not value.startswith('"'):
        return value or None
    match = _SF_STRING.match(value)
    if not match:
        raise InvalidMessage("Idempotency-Key", "is not a valid RFC 8941 string")
    return _SF_UNESCAPE.sub(r"\1", match.group(1))


def extract_context(headers: Mapping[str, str]) -> Context:
    """The OpenTelemetry context of the dispatcher's attempt that sent this
    request, from its W3C ``traceparent`` and ``tracestate`` headers (looked up
    case-insensitively), to pass as ``context=`` to the receiver's server span::

        with tracer.start_as_current_span(
            "POST /hooks", context=extract_context(request.headers), kind=SpanKind.SERVER
        ):
            ...

    A request without a valid ``traceparent`` (or with two different ones) gives
    an empty context: the span is then the root of a new trace. Needs
    ``opentelemetry-api`` (``pip install 'pg-outbox[otel]'``).
    """
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    for name in ("traceparent", "tracestate"):
        values = {value for key, value in headers.items() if key.lower() == name}
        if len(values) == 1:
            carrier[name] = values.pop()
    return TraceContextTextMapPropagator().extract(carrier, context=Context())


class Inbox:
    """Processed idempotency keys in the receiver's own database.

    :param schema: the schema of the ``inbox`` table (created by
        :meth:`ensure_schema`, or by running :meth:`create_sql` yourself).

    Every method runs in the caller's transaction (a SQLAlchemy ``Session``,
    ``Connection``, ``AsyncSession`` or ``AsyncConnection``, a psycopg
    ``Connection`` or ``AsyncConnection``, or a Django connection) and never
    commits.
    """

    def __init__(self, schema: str = DEFAULT_INBOX_SCHEMA) -> None:
        self.schema = check_schema_name(schema)
        self._queries = queries_for(schema)
        self._table_name = sql.Identifier(schema, "inbox").as_string(None)
        self._lock_key = int.from_bytes(
            hashlib.sha256(f"outbox.inbox:{schema}".encode()).digest()[:8], "big", signed=True
        )

    def __repr__(self) -> str:
        return f"Inbox(schema={self.schema!r})"

    def create_sql(self) -> str:
        """The DDL :meth:`ensure_schema` runs, for applications that run their own migrations."""
        create = (self._queries[name].text for name in ("schema_create", "inbox_create_table"))
        return "".join(f"{text};\n" for text in create)

    def ensure_schema(self, tx: Any) -> None:
        """Create the schema and ``inbox`` table if missing (idempotent, concurrency-safe)."""
        run_sync(tx, self._ensure_plan())

    async def ensure_schema_async(self, tx: Any) -> None:
        """As :meth:`ensure_schema`, on an asynchronous transaction."""
        await run_async(tx, self._ensure_plan())

    def claim(self, tx: Any, key: str) -> bool:
        """True the first time ``key`` is claimed in this database, False after.

        The claim belongs to ``tx``: if it rolls back, the key is claimable
        again. A concurrent claim of the same key waits for ``tx`` to end.
        Raises :class:`outbox.InvalidMessage` for a bad key (nothing is sent).
        """
        plan = self._claim_plan(check_key(key, "key"))
        try:
            return run_sync(tx, plan)
        except Exception as exc:
            error = self._missing_table(exc)
            if error is None:
                raise
            raise error from exc

    async def claim_async(self, tx: Any, key: str) -> bool:
        """As :meth:`claim`, on an asynchronous transaction."""
        plan = self._claim_plan(check_key(key, "key"))
        try:
            return await run_async(tx, plan)
        except Exception as exc:
            error = self._missing_table(exc)
            if error is None:
                raise
            raise error from exc

    def purge(self, tx: Any, older_than: timedelta, *, limit: int = 10_000) -> int:
        """Forget up to ``limit`` keys claimed more than ``older_than`` ago; return
        how many. Call it in a loop (each in a short transaction) until it returns
        less than ``limit``.

        Keep keys longer than any sender may still deliver them: a request whose
        key was purged is applied again. Standard Webhooks retries span about a
        day, and a replay may come later still, so a week or more is sensible.
        Raises :class:`outbox.InvalidArgument` (a ``ValueError``) for a non-positive
        ``older_than`` or ``limit``.
        """
        params = self._purge_params(older_than, limit)
        return run_sync(tx, self._purge_plan(params))

    async def purge_async(self, tx: Any, older_than: timedelta, *, limit: int = 10_000) -> int:
        """As :meth:`purge`, on an asynchronous transaction."""
        params = self._purge_params(older_than, limit)
        return await run_async(tx, self._purge_plan(params))

    @staticmethod
    def _purge_params(older_than: timedelta, limit: int) -> dict[str, Any]:
        if not isinstance(older_than, timedelta) or older_than <= timedelta(0):
            raise InvalidArgument("older_than", f"must be a positive timedelta, not {older_than!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument("limit", f"must be a positive integer, not {limit!r}")
        return {"older_than_s": older_than.total_seconds(), "limit": limit}

    def _purge_plan(self, params: dict[str, Any]) -> Plan[int]:
        purged: list[int] = yield self._queries["inbox_purge"], params, scalar
        return purged[0]

    def _missing_table(self, exc: Exception) -> ConfigurationError | None:
        """A missing table (SQLSTATE 42P01) becomes a ConfigurationError saying what to do."""
        if sqlstate(exc) == "42P01":
            return ConfigurationError(
                f"{self._table_name} does not exist: call Inbox.ensure_schema first"
            )
        return None

    def _ensure_plan(self) -> Plan[None]:
        exists: list[bool] = yield (
            self._queries["table_exists"],
            {"table": self._table_name},
            scalar,
        )
        if exists[0]:
            return
        yield self._queries["inbox_lock"], {"lock": self._lock_key}, None
        schema: list[bool] = yield (
            self._queries["schema_exists"],
            {"schema": self.schema},
            scalar,
        )
        if not schema[0]:
            yield self._queries["schema_create"], {}, None
        yield self._queries["inbox_create_table"], {}, None

    def _claim_plan(self, key: str) -> Plan[bool]:
        rows = yield self._queries["inbox_claim"], {"key": key}, None
        return bool(rows)
