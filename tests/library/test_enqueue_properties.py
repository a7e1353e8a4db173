"""Bad input is rejected before anything reaches the server (property tests).

Each property runs all its examples in ONE open psycopg transaction. After every
rejected call the transaction must still be usable (an error sent to the server
would have aborted it) and hold no message or key, which proves nothing was sent.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.pq import TransactionStatus

from outbox import InvalidMessage, Outbox
from outbox._message import MAX_KEY_LENGTH, METHODS

Conn = psycopg.Connection[tuple[Any, ...]]

# One connection (and transaction) per property, shared by its examples on purpose.
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
URL = "https://example.com/hook"
VALID: dict[str, Any] = {"url": URL, "idempotency_key": "key-1", "json": {"ok": True}}
TOKEN_CHARS = "!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits
RESERVED = {"host", "content-length", "content-type", "transfer-encoding", "connection"}
RESERVED |= {"keep-alive", "proxy-connection", "te", "trailer", "upgrade", "idempotency-key"}

# Characters that must never reach an HTTP header: CR, LF, NUL, other C0 controls, DEL.
CONTROL = st.sampled_from(["\r", "\n", "\x00", "\r\n", "\x0b", "\x0c", "\x1b", "\x7f"])
PRINTABLE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20)


@pytest.fixture
def conn(database_url: str) -> Iterator[Conn]:
    """An open (not autocommit) transaction that has already run a statement."""
    connection = psycopg.connect(database_url)
    connection.execute("SELECT 1")
    yield connection
    connection.close()


def assert_rejected_and_nothing_sent(
    conn: Conn, field: str, box: Outbox | None = None, **overrides: Any
) -> None:
    box = box or Outbox()
    with pytest.raises(InvalidMessage) as info:
        box.enqueue(conn, **{**VALID, **overrides})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    # Still in the same healthy transaction, and it holds nothing.
    assert conn.info.transaction_status == TransactionStatus.INTRANS
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM outbox.messages), (SELECT count(*) FROM outbox.message_keys)"
    ).fetchone()
    assert counts == (0, 0)


def with_inserted(base: st.SearchStrategy[str], bad: st.SearchStrategy[str]) -> Any:
    """Strings from ``base`` with a ``bad`` piece inserted at a random position."""

    @st.composite
    def build(draw: st.DrawFn) -> str:
        text = draw(base)
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(bad) + text[at:]

    return build()


# -- url -----------------------------------------------------------------------------

schemes = (
    st.tuples(
        st.sampled_from(string.ascii_lowercase),
        st.text(st.sampled_from(string.ascii_lowercase + string.digits + "+-."), max_size=9),
    )
    .map("".join)
    .filter(lambda s: s not in ("http", "https"))
)


@PROPERTY
@given(scheme=schemes, upper=st.booleans())
def test_url_with_a_non_http_scheme_is_rejected(conn: Conn, scheme: str, upper: bool) -> None:
    scheme = scheme.upper() if upper else scheme
    assert_rejected_and_nothing_sent(conn, "url", url=f"{scheme}://example.com/hook")


@PROPERTY
@given(url=with_inserted(st.just(URL), st.one_of(CONTROL, st.sampled_from([" ", "\t", "\u00e9"]))))
def test_url_with_spaces_or_control_characters_is_rejected(conn: Conn, url: str) -> None:
    assert_rejected_and_nothing_sent(conn, "url", url=url)


@PROPERTY
@given(user=PRINTABLE.filter(lambda s: "/" not in s and "?" not in s and "#" not in s))
def test_url_with_credentials_is_rejected(conn: Conn, user: str) -> None:
    assert_rejected_and_nothing_sent(conn, "url", url=f"https://{user}@example.com/")


# -- headers -------------------------------------------------------------------------

header_names = st.text(st.sampled_from(TOKEN_CHARS), min_size=1, max_size=20).filter(
    lambda s: s.lower() not in RESERVED and not s.lower().startswith("webhook-")
)


@PROPERTY
@given(name=header_names, value=with_inserted(PRINTABLE, CONTROL))
def test_header_value_with_control_characters_is_rejected(
    conn: Conn, name: str, value: str
) -> None:
    assert_rejected_and_nothing_sent(conn, f"headers[{name}]", headers={name: value})


@PROPERTY
@given(name=with_inserted(header_names, st.one_of(CONTROL, st.sampled_from([" ", ":", "\u00e9"]))))
def test_header_name_that_is_not_a_token_is_rejected(conn: Conn, name: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        Outbox().enqueue(conn, **VALID, headers={name: "v"})
    assert info.value.field.startswith("headers[")
    assert "\r" not in str(info.value)
    assert "\n" not in str(info.value)
    assert_rejected_and_nothing_sent(conn, info.value.field, headers={name: "v"})


@PROPERTY
@given(
    name=st.sampled_from([*sorted(RESERVED), "webhook-id", "webhook-signature"]),
    flips=st.lists(st.booleans(), min_size=20, max_size=20),
)
def test_reserved_header_is_rejected_in_any_case(conn: Conn, name: str, flips: list[bool]) -> None:
    mixed = "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=False))
    assert_rejected_and_nothing_sent(conn, f"headers[{mixed}]", headers={mixed: "x"})


# -- keys ----------------------------------------------------------------------------


@PROPERTY
@given(
    key=st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E),
        min_size=MAX_KEY_LENGTH + 1,
        max_size=400,
    )
)
def test_over_long_idempotency_key_is_rejected(conn: Conn, key: str) -> None:
    assert len(key) > MAX_KEY_LENGTH
    assert_rejected_and_nothing_sent(conn, "idempotency_key", idempotency_key=key)


@PROPERTY
@given(
    field=st.sampled_from(["idempotency_key", "ordering_key"]),
    key=st.one_of(
        with_inserted(
            PRINTABLE, st.one_of(CONTROL, st.just("\t"), st.characters(min_codepoint=0x80))
        ),
        PRINTABLE.map(lambda s: " " + s),
        PRINTABLE.map(lambda s: s + " "),
        st.just(""),
    ),
)
def test_key_with_control_characters_or_outer_spaces_is_rejected(
    conn: Conn, field: str, key: str
) -> None:
    overrides: dict[str, Any] = {field: key}
    assert_rejected_and_nothing_sent(conn, field, **overrides)


# -- body ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


def _poison(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    in_list = st.tuples(children, st.lists(json_values, max_size=3), st.integers(0, 3)).map(
        lambda t: [*t[1][: t[2]], t[0], *t[1][t[2] :]]
    )
    in_dict = st.tuples(
        st.text(max_size=5), children, st.dictionaries(st.text(max_size=5), json_values, max_size=3)
    ).map(lambda t: {**t[2], t[0]: t[1]})
    return in_list | in_dict


# JSON documents with a NaN or an infinity somewhere inside.
poisoned_json = st.recursive(
    st.sampled_from([math.nan, math.inf, -math.inf]), _poison, max_leaves=8
)


@PROPERTY
@given(value=poisoned_json)
def test_json_containing_nan_or_infinity_is_rejected(conn: Conn, value: Any) -> None:
    assert_rejected_and_nothing_sent(conn, "json", json=value)


@PROPERTY
@given(
    value=st.one_of(
        st.builds(object),
        st.sets(st.integers(), max_size=3),
        st.binary(max_size=5),
        st.complex_numbers(),
    ).flatmap(lambda bad: st.sampled_from([bad, [bad], {"k": bad}, {"a": [1, {"b": bad}]}]))
)
def test_json_with_values_json_cannot_encode_is_rejected(conn: Conn, value: Any) -> None:
    assert_rejected_and_nothing_sent(conn, "json", json=value)


@PROPERTY
@given(limit=st.integers(1, 64), extra=st.integers(1, 64), as_text=st.booleans())
def test_body_over_the_limit_is_rejected(conn: Conn, limit: int, extra: int, as_text: bool) -> None:
    body: bytes | str = "x" * (limit + extra) if as_text else b"\x00" * (limit + extra)
    box = Outbox(max_body_bytes=limit)
    assert_rejected_and_nothing_sent(conn, "body", box, json=None, body=body)


@PROPERTY
@given(
    content_type=st.one_of(
        with_inserted(st.just("application/json"), CONTROL),
        PRINTABLE.filter(lambda s: "/" not in s),
    )
)
def test_bad_content_type_is_rejected(conn: Conn, content_type: str) -> None:
    assert_rejected_and_nothing_sent(conn, "content_type", content_type=content_type)


# -- the other fields ----------------------------------------------------------------


@PROPERTY
@given(
    value=st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=1001),
        st.booleans(),
        st.floats(),
        st.text(max_size=4),
    )
)
def test_bad_max_attempts_is_rejected(conn: Conn, value: object) -> None:
    assert_rejected_and_nothing_sent(conn, "max_attempts", max_attempts=value)


@PROPERTY
@given(method=st.text(max_size=8).filter(lambda s: s.upper() not in METHODS))
def test_unknown_method_is_rejected(conn: Conn, method: str) -> None:
    assert_rejected_and_nothing_sent(conn, "method", method=method)


@PROPERTY
@given(when=st.datetimes())
def test_naive_available_at_is_rejected(conn: Conn, when: datetime) -> None:
    assert_rejected_and_nothing_sent(conn, "available_at", available_at=when)


def test_the_transaction_stays_usable_for_a_valid_message(conn: Conn, database_url: str) -> None:
    """The proof above is only as good as the transaction it ran in: a valid message
    written after rejected ones commits normally."""
    box = Outbox()
    assert_rejected_and_nothing_sent(conn, "url", url="ftp://example.com/")
    message_id = box.enqueue(conn, **VALID)
    conn.commit()
    with psycopg.connect(database_url, autocommit=True) as observer:
        assert observer.execute("SELECT id FROM outbox.messages").fetchall() == [(message_id,)]
