"""The SQL functions and the library are one behaviour (property tests).

Each generated input goes through ``Outbox.enqueue`` (or ``publish``) and through
``outbox.enqueue(...)`` (or ``outbox.publish(...)``) in SQL, each under a
savepoint of one transaction that is rolled back after it, and the two must
agree: the same refusal (field and wording), or the same row written, digest
included. Inputs are what both can be given: no NUL (PostgreSQL's text cannot
hold one), JSON without floats and with its keys in jsonb's order (which the SQL
side cannot tell from any other order: migration 0022 says why), and bodies as
bytes.

The one translation: the library's ``json`` argument is the functions'
``json_body`` (``json`` is a keyword of PostgreSQL 16 and later), so a refusal
naming one names the other.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from outbox import InvalidMessage, Outbox, Tenants
from outbox.endpoints import Endpoints

Conn = psycopg.Connection[tuple[Any, ...]]

PARITY = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- inputs --------------------------------------------------------------------------

TEXT = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)

SCHEMES = st.sampled_from(["http", "https", "HTTPS", "ftp", "h+t", "1http", ""])
SEPARATORS = st.sampled_from(["://", ":", ":///", "//", "://://"])
USERS = st.sampled_from(["", "", "", "u@", "u:p@", "@"])
HOSTS = st.sampled_from(
    [
        "example.com", "Example.COM", "127.0.0.1", "127.1", "0x7f.1", "0X7F.0.0.1",
        "2130706433", "017700000001", "1.2.3.4.", "256.1.1.1", "1.2.3", "0x", "08.1.1.1",
        "01.2.3.4", "1..2", "4294967296", "0xffffffff", "a.1", "[::1]", "[::FFFF:1.2.3.4]",
        "[1.2.3.4]", "[v1.x]", "[vz]", "[fe80::1%25eth0]", "[fe80::1%]", "[zz]", "[::1",
        "::1]", "", "a%2eb", "[1:2:3:4:5:6:7:8]", "[1::2::3]", "[12345::]", "[::1]x",
        "xn--bcher-kva.example", "a'b.1",
    ]
)  # fmt: skip
PORTS = st.sampled_from(
    ["", "", "", ":", ":80", ":0", ":00", ":65535", ":65536", ":x", ":0080", ":99999999"]
)
PATHS = st.sampled_from(["", "/", "/a?b=1", "/#frag", "#", "/a b", "/\u00e9", "?q", "/a@b"])


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
    """``valid`` three times in four: each check refuses the first field at fault,
    so the fields after one must be valid often for their own checks to be reached."""
    return st.integers(0, 3).flatmap(lambda n: hostile if n == 0 else valid)


GOOD_URLS = st.builds(
    lambda *parts: "".join(parts),
    st.sampled_from(["http", "https", "HTTPS"]),
    st.just("://"),
    st.sampled_from(["example.com", "Example.COM", "127.0.0.1", "[::1]", "[::FFFF:1.2.3.4]"]),
    st.sampled_from(["", ":80", ":0080", ":65535"]),
    st.sampled_from(["", "/", "/a?b=1", "/a@b", "/%41"]),
)


@st.composite
def hostile_urls(draw: st.DrawFn) -> str:
    """A URL of good parts with some of them (each one time in three) hostile."""
    if draw(st.integers(0, 9)) == 0:  # now and then, anything printable
        return draw(st.text(PRINTABLE, max_size=40))
    good = ("https", "://", "", "example.com", "", "/")
    hostile = (SCHEMES, SEPARATORS, USERS, HOSTS, PORTS, PATHS)
    return "".join(
        draw(bad) if draw(st.integers(0, 2)) == 0 else part
        for part, bad in zip(good, hostile, strict=True)
    )


def urls() -> Any:
    return mostly(GOOD_URLS, hostile_urls())


KEYS = mostly(
    st.sampled_from(["k", "order-42", "a" * 255, "k:1 x"]),
    st.one_of(
        st.sampled_from([" k", "k ", "a" * 256, "", "\u00e9t\u00e9"]),
        st.text(PRINTABLE, min_size=1, max_size=12),
        st.text(TEXT, max_size=6),
    ),
)


def jsonb_order(value: Any) -> Any:
    """``value`` with every object's keys in jsonb's order: shorter first, then by
    their bytes (what the SQL side stores, whatever order it was given)."""
    if isinstance(value, dict):
        ordered = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: jsonb_order(value[k]) for k in ordered}
    if isinstance(value, list):
        return [jsonb_order(v) for v in value]
    return value


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(TEXT, max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(TEXT, max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
).map(jsonb_order)

HEADER_NAMES = st.one_of(
    st.sampled_from(
        ["X-Api", "x-api", "Content-Type", "Webhook-Id", "Idempotency-Key", "Host", "X Y",
         "", "TE", "X\u00e9", "A" * 257, "traceparent"]
    ),
    st.text(st.sampled_from("!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits),
            min_size=1, max_size=8),
)  # fmt: skip
HEADER_VALUES = st.one_of(
    st.sampled_from(["v", "", "a\tb", "a\r\nb", "\u00e9", "x" * 8193]),
    st.text(PRINTABLE, max_size=10),
)
HEADERS = mostly(
    st.none()
    | st.dictionaries(
        st.sampled_from(["X-Api", "X-B", "a"]), st.text(PRINTABLE, max_size=5), max_size=2
    ).map(jsonb_order),
    st.one_of(
        st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=3).map(jsonb_order),
        st.dictionaries(HEADER_NAMES, st.integers(0, 3), min_size=1, max_size=1),
    ),
)
CONTENT_TYPES = st.sampled_from(
    [None, None, None, None, None, "application/json", "application/json",
     "text/plain; charset=utf-8", "bad", "a/b ; x", "a/b\n", "a/b" + "c" * 300,
     "application/vnd.api+json", "a b/c"]
)  # fmt: skip
METHODS = mostly(
    st.sampled_from(["POST", "get", "Put", "PATCH", "delete"]),
    st.sampled_from(["HEAD", "", "PO ST"]),
)
NOW = datetime.now(UTC)
WHEN = st.sampled_from(
    [None, None, None, None, None, None, datetime(1999, 12, 31, tzinfo=UTC),
     datetime(2000, 1, 2, tzinfo=UTC), NOW - timedelta(days=1), NOW + timedelta(days=1),
     NOW + timedelta(days=3652), NOW + timedelta(days=3654)]
)  # fmt: skip
ATTEMPTS = mostly(st.none() | st.integers(1, 1000), st.integers(-1, 1001))


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """``json`` or ``body``, or both or neither (each refused)."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return {}
    if choice == 1:
        return {"json": {"a": 1}, "body": b"x"}
    if choice < 6:
        return {"json": draw(JSON.filter(lambda v: v is not None))}
    return {"body": draw(st.binary(max_size=20))}


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "url": draw(urls()),
        "idempotency_key": draw(KEYS),
        **draw(bodies()),
        "content_type": draw(CONTENT_TYPES),
        "method": draw(METHODS),
        "headers": draw(HEADERS),
        "ordering_key": draw(st.none() | KEYS),
        "available_at": draw(WHEN),
        "max_attempts": draw(ATTEMPTS),
    }


# -- the two sides -------------------------------------------------------------------

ROW = (
    "SELECT m.idempotency_key, m.target, m.destination, m.endpoint_id, m.url, m.method,"
    " m.headers, m.body, m.content_type, m.event_type, m.ordering_key, m.state,"
    " m.max_attempts, m.available_at, m.trace_context, k.digest,"
    " (SELECT e.digest FROM outbox.events AS e"
    "  WHERE e.event_key || ':' || m.endpoint_id = m.idempotency_key) AS event_digest"
    " FROM outbox.messages AS m"
    " JOIN outbox.message_keys AS k USING (target, idempotency_key)"
    " WHERE m.id = ANY (%s) ORDER BY m.target, m.idempotency_key"
)

ENQUEUE = (
    "SELECT outbox.enqueue(url => %(url)s, idempotency_key => %(idempotency_key)s,"
    " json_body => %(json_body)s, body => %(body)s, content_type => %(content_type)s,"
    " method => %(method)s, headers => %(headers)s, ordering_key => %(ordering_key)s,"
    " available_at => %(available_at)s, max_attempts => %(max_attempts)s::integer)"
)

PUBLISH = (
    "SELECT outbox.publish(event_type => %(event_type)s, payload => %(payload)s,"
    " idempotency_key => %(idempotency_key)s, ordering_key => %(ordering_key)s,"
    " tenant => %(tenant)s)"
)

Outcome = tuple[str, Any]


def undone(conn: Conn, write: Any) -> Outcome:
    """What ``write(conn)`` did (``("rows", ...)``) or refused (``("refused", (field,
    message))``), under a savepoint rolled back after it."""
    with conn.cursor() as cur:
        cur.execute("SAVEPOINT parity")
        try:
            ids = write(cur)
        except InvalidMessage as exc:
            outcome: Outcome = ("refused", (exc.field, str(exc)))
        except psycopg.Error as exc:
            assert exc.sqlstate in ("OB001", "OB002"), exc
            outcome = ("refused", (exc.diag.column_name, exc.diag.message_primary))
        else:
            outcome = ("rows", cur.execute(ROW, (ids,)).fetchall())
        cur.execute("ROLLBACK TO SAVEPOINT parity")
    return outcome


def shown(outcome: Outcome) -> str:
    """The kind of an outcome, for ``--hypothesis-show-statistics``: written, or
    refused and which field."""
    kind, detail = outcome
    return "written" if kind == "rows" else f"refused: {detail[0]}"


def in_sql_terms(outcome: Outcome) -> Outcome:
    """A library outcome as the functions word it (the module docstring's one translation)."""
    kind, detail = outcome
    if kind == "refused" and detail[0] == "json":
        problem = detail[1].removeprefix("json: ")
        problem = problem.replace(
            "give exactly one of json= or body=", "give exactly one of json_body or body"
        )
        return kind, ("json_body", "json_body: " + problem)
    return outcome


@pytest.fixture
def conn(database_url: str) -> Iterator[Conn]:
    with psycopg.connect(database_url) as connection:
        Endpoints().add(connection, url="https://example.com/one")
        Endpoints().add(connection, url="https://example.com/two", event_types=["order.*"])
        Tenants().add(connection, "customer-17")
        Endpoints().add(connection, url="https://example.com/c17", tenant="customer-17")
        yield connection


@PARITY
@given(message=messages())
@pytest.mark.slow
def test_enqueue_in_sql_refuses_and_writes_exactly_what_the_library_does(
    conn: Conn, message: dict[str, Any]
) -> None:
    box = Outbox(notify=False)
    library = undone(conn, lambda cur: [box.enqueue(cur.connection, **message)])

    params = {k: v for k, v in message.items() if k not in ("json", "body")}
    params["json_body"] = Jsonb(message["json"]) if "json" in message else None
    params["body"] = message.get("body")
    params["headers"] = None if message["headers"] is None else Jsonb(message["headers"])
    functions = undone(conn, lambda cur: [cur.execute(ENQUEUE, params).fetchone()[0]])

    assert functions == in_sql_terms(library)
    event(shown(library))


EVENT_TYPES = mostly(
    st.sampled_from(["order.paid", "refund", "x" * 255]),
    st.one_of(
        st.sampled_from(["order.*", "a b", "", "x" * 256, "\u00e9", "outbox.lag.exceeded"]),
        st.text(PRINTABLE, min_size=1, max_size=8),
    ),
)
_TIMESTAMP = re.compile(rb'"timestamp":"[^"]*"')


def without_timestamp(outcome: Outcome) -> Outcome:
    """The envelope's timestamp is the time of each call: left out of the comparison."""
    kind, detail = outcome
    if kind != "rows":
        return outcome
    rows = []
    for row in detail:
        body = bytes(row[7])
        assert len(_TIMESTAMP.findall(body)) == 1, body
        rows.append((*row[:7], _TIMESTAMP.sub(b'"timestamp":""', body), *row[8:]))
    return kind, rows


@PARITY
@given(
    event_type=EVENT_TYPES,
    payload=JSON,
    key=st.one_of(st.none(), KEYS, st.just("e" * 201)),
    ordering_key=st.none() | KEYS,
    # the operator's endpoints, a tenant's, a tenant not created, a malformed id
    tenant=st.sampled_from([None, None, "customer-17", "customer-99", "a b", ""]),
)
@pytest.mark.slow
def test_publish_in_sql_refuses_and_writes_exactly_what_the_library_does(
    conn: Conn,
    event_type: str,
    payload: Any,
    key: str | None,
    ordering_key: str | None,
    tenant: str | None,
) -> None:
    key = key or "evt-parity"  # a random key would differ between the two
    box = Outbox(notify=False)
    library = undone(
        conn,
        lambda cur: box.publish(
            cur.connection,
            event_type,
            payload,
            idempotency_key=key,
            ordering_key=ordering_key,
            tenant=tenant,
        ),
    )
    params = {
        "event_type": event_type,
        "payload": Jsonb(payload),
        "idempotency_key": key,
        "ordering_key": ordering_key,
        "tenant": tenant,
    }
    functions = undone(conn, lambda cur: cur.execute(PUBLISH, params).fetchone()[0])

    assert without_timestamp(functions) == without_timestamp(library)
    event(shown(library))
    if library[0] == "rows":
        assert [json.loads(bytes(row[7]))["data"] for row in library[1]] == [payload] * len(
            library[1]
        )


@PARITY
@given(url=hostile_urls())
@pytest.mark.slow
def test_urls_are_read_alike_however_they_are_written(conn: Conn, url: str) -> None:
    """URLs alone, hostile ones: the checks most worth comparing input by input,
    since each side reads a URL with its own parser."""
    library = undone(
        conn,
        lambda cur: [
            Outbox(notify=False).enqueue(cur.connection, url=url, idempotency_key="k", body=b"x")
        ],
    )
    params = {"url": url, "idempotency_key": "k", "body": b"x", "json_body": None}
    params |= {"content_type": None, "method": "POST", "headers": None}
    params |= {"ordering_key": None, "available_at": None, "max_attempts": None}
    functions = undone(conn, lambda cur: [cur.execute(ENQUEUE, params).fetchone()[0]])

    assert functions == library
    event(shown(library) if library[0] == "rows" else library[1][1])
