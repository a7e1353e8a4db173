"""Every text parameter of every public function that writes (or reads by) text
refuses what PostgreSQL cannot store, a NUL character or a lone surrogate, with
the error its module uses for bad input, naming the field, before any statement
is sent: the caller's transaction goes on, what it wrote before still there.

The cases are checked against the functions' signatures, so a text parameter
added later without a case here fails :func:`test_every_text_parameter_has_a_case`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from outbox import InvalidArgument, InvalidMessage, OAuth2ClientCredentials, Outbox, admin
from outbox.destinations import Destinations
from outbox.endpoints import Endpoints
from outbox.event_types import EventTypes
from outbox.receiver import Inbox

Conn = psycopg.Connection[Any]
URL = "https://example.com/hook"
SECRET = "whsec_" + "A" * 32

WRITERS: dict[str, Callable[..., Any]] = {
    "Outbox.enqueue": Outbox.enqueue,
    "Outbox.publish": Outbox.publish,
    "Endpoints.add": Endpoints.add,
    "Endpoints.update": Endpoints.update,
    "Endpoints.rotate_secret": Endpoints.rotate_secret,
    "Endpoints.disable": Endpoints.disable,
    "Destinations.set": Destinations.set,
    "Destinations.get": Destinations.get,
    "Destinations.require": Destinations.require,
    "Destinations.delete": Destinations.delete,
    "EventTypes.set": EventTypes.set,
    "EventTypes.get": EventTypes.get,
    "EventTypes.delete": EventTypes.delete,
    "admin.dead_list": admin.dead_list,
    "admin.dead_count": admin.dead_count,
    "admin.dead_retry": admin.dead_retry,
    "admin.dead_purge": admin.dead_purge,
    "admin.replay_event": admin.replay_event,
    "Inbox.claim": Inbox.claim,
}
"""The public functions that send text to the database, by name. (The async
twins share their synchronous twin's checks: ``_enqueue_plan``, ``_event``.)"""

NOT_TEXT = {"schema"}
"""Text parameters that are not data: a schema name is configuration, refused
as :class:`~outbox.ConfigurationError` (see the last test)."""


@dataclass(frozen=True)
class Case:
    """One text parameter: how to call its function with ``bad`` in it, and the
    field and error it must be refused with."""

    function: str
    parameter: str
    call: Callable[[Conn, int, str], object]
    field: str
    error: type[InvalidArgument] = InvalidMessage

    @property
    def id(self) -> str:
        return f"{self.function}({self.parameter}={self.field})"


def _enqueue(**kwargs: Any) -> Callable[[Conn, int, str], object]:
    def call(conn: Conn, endpoint: int, bad: str) -> object:
        given = {"url": URL, "idempotency_key": "k", "json": {"a": 1}}
        given |= {k: v(bad) if callable(v) else v for k, v in kwargs.items()}
        return Outbox().enqueue(conn, **given)

    return call


def _bad(text: str) -> Callable[[str], str]:
    return lambda bad: text.replace("_", bad)


def _oauth2(**given: str) -> OAuth2ClientCredentials:
    fields = {"token_url": URL, "client_id": "c", "client_secret": "s"} | given
    return OAuth2ClientCredentials(**fields)


AUTH_CASES: list[tuple[str, str, Callable[[str], dict[str, Any]]]] = [
    ("headers", "headers[", lambda b: {"url": URL, "headers": {"X-A" + b: "v"}}),
    ("headers", "headers[X-A]", lambda b: {"url": URL, "headers": {"X-A": "v" + b}}),
    ("basic_auth", "basic_auth", lambda b: {"url": URL, "basic_auth": ("u" + b, "p")}),
    ("basic_auth", "basic_auth", lambda b: {"url": URL, "basic_auth": ("u", "p" + b)}),
    ("bearer_token", "bearer_token", lambda b: {"url": URL, "bearer_token": "t" + b}),
    *[
        (
            "oauth2",
            f"oauth2.{name}",
            lambda b, name=name: {"url": URL, "oauth2": _oauth2(**{name: "x" + b})},
        )
        for name in ("token_url", "client_id", "client_secret", "scope", "audience")
    ],
]
"""The credentials' cases, for ``add`` and ``update`` alike (the URL, valid, is
no change to ``update``)."""

CASES = [
    Case("Outbox.enqueue", "url", _enqueue(url=_bad(URL + "_")), "url"),
    Case(
        "Outbox.enqueue", "idempotency_key", _enqueue(idempotency_key=_bad("k_")), "idempotency_key"
    ),
    Case("Outbox.enqueue", "method", _enqueue(method=_bad("PO_ST")), "method"),
    Case(
        "Outbox.enqueue", "content_type", _enqueue(content_type=_bad("text/_plain")), "content_type"
    ),
    Case("Outbox.enqueue", "headers", _enqueue(headers=lambda b: {"X-A" + b: "v"}), "headers["),
    Case("Outbox.enqueue", "headers", _enqueue(headers=lambda b: {"X-A": "v" + b}), "headers[X-A]"),
    Case("Outbox.enqueue", "ordering_key", _enqueue(ordering_key=_bad("o_")), "ordering_key"),
    Case("Outbox.enqueue", "body", _enqueue(json=None, body=_bad("a_")), "body"),
    Case(
        "Outbox.publish",
        "event_type",
        lambda c, e, b: Outbox().publish(c, "a" + b, {}),
        "event_type",
    ),
    Case(
        "Outbox.publish",
        "idempotency_key",
        lambda c, e, b: Outbox().publish(c, "a", {}, idempotency_key="k" + b),
        "idempotency_key",
    ),
    Case(
        "Outbox.publish",
        "ordering_key",
        lambda c, e, b: Outbox().publish(c, "a", {}, ordering_key="k" + b),
        "ordering_key",
    ),
    Case(
        "Outbox.publish",
        "tenant",
        lambda c, e, b: Outbox().publish(c, "a", {}, tenant="t" + b),
        "tenant",
    ),
    *[
        Case("Endpoints.add", name, lambda c, e, b, kw=kw: Endpoints().add(c, **kw(b)), field)
        for name, field, kw in [
            ("url", "url", lambda b: {"url": URL + b}),
            ("tenant", "tenant", lambda b: {"url": URL, "tenant": "t" + b}),
            ("event_types", "event_types", lambda b: {"url": URL, "event_types": ["a" + b]}),
            ("secret", "secret", lambda b: {"url": URL, "secret": SECRET + b}),
            ("description", "description", lambda b: {"url": URL, "description": "d" + b}),
            ("metadata", "metadata", lambda b: {"url": URL, "metadata": {"a": [{"b": b}]}}),
            ("metadata", "metadata", lambda b: {"url": URL, "metadata": {"k" + b: 1}}),
            ("filter", "filter", lambda b: {"url": URL, "filter": f"a == '{b}'"}),
            ("ca_bundle", "ca_bundle", lambda b: {"url": URL, "ca_bundle": "PEM" + b}),
            (
                "client_cert",
                "client_cert",
                lambda b: {"url": URL, "client_cert": "PEM" + b, "client_key": "PEM"},
            ),
            (
                "client_key",
                "client_key",
                lambda b: {"url": URL, "client_cert": "PEM", "client_key": "PEM" + b},
            ),
            *AUTH_CASES,
        ]
    ],
    *[
        Case(
            "Endpoints.update",
            name,
            lambda c, e, b, kw=kw: Endpoints().update(c, e, **kw(b)),
            field,
        )
        for name, field, kw in [
            ("url", "url", lambda b: {"url": URL + b}),
            ("event_types", "event_types", lambda b: {"event_types": ["a.*" + b]}),
            ("description", "description", lambda b: {"description": b}),
            ("metadata", "metadata", lambda b: {"metadata": {"a": b}}),
            ("filter", "filter", lambda b: {"filter": f"a == '{b}'"}),
            ("ca_bundle", "ca_bundle", lambda b: {"ca_bundle": b}),
            ("client_cert", "client_cert", lambda b: {"client_cert": b, "client_key": "PEM"}),
            ("client_key", "client_key", lambda b: {"client_cert": "PEM", "client_key": b}),
            *AUTH_CASES,
        ]
    ],
    Case(
        "Endpoints.rotate_secret",
        "secret",
        lambda c, e, b: Endpoints().rotate_secret(c, e, secret=SECRET + b),
        "secret",
    ),
    Case(
        "Endpoints.disable", "reason", lambda c, e, b: Endpoints().disable(c, e, reason=b), "reason"
    ),
    *[
        Case(f"Destinations.{name}", "destination", call, "destination")
        for name, call in [
            ("set", lambda c, e, b: Destinations().set(c, URL + b, max_concurrency=1)),
            ("get", lambda c, e, b: Destinations().get(c, URL + b)),
            ("require", lambda c, e, b: Destinations().require(c, URL + b)),
            ("delete", lambda c, e, b: Destinations().delete(c, URL + b)),
        ]
    ],
    *[
        Case(f"EventTypes.{name}", "event_type", call, "event_type", InvalidArgument)
        for name, call in [
            ("set", lambda c, e, b: EventTypes().set(c, "a" + b, retry_schedule=[1])),
            ("get", lambda c, e, b: EventTypes().get(c, "a" + b)),
            ("delete", lambda c, e, b: EventTypes().delete(c, "a" + b)),
        ]
    ],
    *[
        Case(f"admin.{name}", "event_type", call, "event_type", InvalidArgument)
        for name, call in [
            ("dead_list", lambda c, e, b: admin.dead_list(c, event_type="a" + b)),
            ("dead_count", lambda c, e, b: admin.dead_count(c, event_type="a" + b)),
            ("dead_retry", lambda c, e, b: admin.dead_retry(c, event_type="a" + b)),
            ("dead_purge", lambda c, e, b: admin.dead_purge(c, event_type="a" + b)),
        ]
    ],
    *[
        Case(f"admin.{name}", "tenant", call, "tenant", InvalidArgument)
        for name, call in [
            ("dead_list", lambda c, e, b: admin.dead_list(c, tenant="t" + b)),
            ("dead_count", lambda c, e, b: admin.dead_count(c, tenant="t" + b)),
            ("dead_retry", lambda c, e, b: admin.dead_retry(c, tenant="t" + b)),
            ("dead_purge", lambda c, e, b: admin.dead_purge(c, tenant="t" + b)),
        ]
    ],
    Case(
        "admin.replay_event",
        "event_key",
        lambda c, e, b: admin.replay_event(c, event_key="evt" + b, endpoint_id=e),
        "event_key",
        InvalidArgument,
    ),
    Case("Inbox.claim", "key", lambda c, e, b: Inbox().claim(c, "k" + b), "key"),
]

HOSTILE_TEXT = {"nul": "\x00", "surrogate": "\udcff"}
"""What no ``text`` (nor string in ``jsonb``) can hold: a NUL character, and a
lone surrogate (what Python makes of bytes in ``argv`` that are not UTF-8)."""

ACCEPTED = {("Outbox.enqueue", "body", "nul")}
"""A body is bytes (``bytea``): a str body with a NUL is sent as it is."""


def _text_parameters(function: Callable[..., Any]) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if "str" in str(parameter.annotation) and name not in NOT_TEXT
    }


def test_every_text_parameter_has_a_case() -> None:
    expected = {(name, p) for name, f in WRITERS.items() for p in _text_parameters(f)}
    covered = {(case.function, case.parameter) for case in CASES}
    assert expected - covered == set()


@pytest.fixture
def conn(database_url: str) -> Iterator[Conn]:
    """A connection in a transaction that has written already: an endpoint (to
    update, disable, replay to) and a message, committed first, then one more
    message in the open transaction."""
    with psycopg.connect(database_url) as conn:
        Inbox().ensure_schema(conn)
        Endpoints().add(conn, url=URL, event_types=["a"])
        conn.commit()
        Outbox().enqueue(conn, url=URL, idempotency_key="before", json=1)
        yield conn
        conn.rollback()


@pytest.mark.parametrize("kind", list(HOSTILE_TEXT))
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_text_postgresql_cannot_store_is_refused_before_any_statement(
    conn: Conn, case: Case, kind: str
) -> None:
    (endpoint,) = conn.execute("SELECT id FROM outbox.endpoints").fetchone() or ()
    bad = HOSTILE_TEXT[kind]
    if (case.function, case.parameter, kind) in ACCEPTED:
        case.call(conn, endpoint, bad)
    else:
        with pytest.raises(case.error) as refused:
            case.call(conn, endpoint, bad)
        assert refused.value.field.startswith(case.field), refused.value
        if case.error is InvalidArgument:
            assert type(refused.value) is InvalidArgument
    # the caller's transaction goes on, with what it wrote before
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert conn.execute(
        "SELECT count(*) FROM outbox.messages WHERE idempotency_key = 'before'"
    ).fetchone() == (1,)


def test_a_nul_in_a_published_payload_is_data_not_text(conn: Conn) -> None:
    """A payload is stored as bytes: a NUL in one of its strings is sent as JSON
    writes it (``\\u0000``), not refused."""
    (message,) = Outbox().publish(conn, "a", {"a": "\x00"})
    (body,) = (
        conn.execute("SELECT body FROM outbox.messages WHERE id = %s", [message]).fetchone() or ()
    )
    assert b'"a":"\\u0000"' in bytes(body)


def test_the_metadata_refused_names_where_in_it(conn: Conn) -> None:
    (endpoint,) = conn.execute("SELECT id FROM outbox.endpoints").fetchone() or ()
    with pytest.raises(InvalidMessage, match=r"NUL character .* at \['a'\]\[0\]\['b'\]"):
        Endpoints().update(conn, endpoint, metadata={"a": [{"b": "x\x00"}]})
    assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("schema", ["out\x00box", "out\udcffbox"])
def test_a_schema_name_postgresql_cannot_store_is_a_configuration_error(schema: str) -> None:
    from outbox import ConfigurationError

    for make in (Outbox, Endpoints, Destinations, EventTypes, Inbox):
        with pytest.raises(ConfigurationError, match="schema"):
            make(schema=schema)
    with pytest.raises(ConfigurationError, match="schema"):
        admin.dead_list(object(), schema=schema, event_type="a")
