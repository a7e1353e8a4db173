"""Validation of new messages (outbox._message), without a database.

Every rejection must raise :class:`outbox.InvalidMessage` whose ``field`` names the
argument at fault and whose text starts with that field; every accepted form must
produce exactly the bytes, content type and method that will be sent.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest

from outbox import ConfigurationError, InvalidMessage, Outbox, OutboxError
from outbox._digest import request_digest
from outbox._message import (
    EARLIEST_AVAILABLE_AT,
    MAX_ATTEMPTS_LIMIT,
    MAX_HEADER_NAME,
    MAX_HEADER_VALUE,
    MAX_HEADERS,
    MAX_SCHEDULE_AHEAD,
    MAX_URL_LENGTH,
    NewMessage,
    build_message,
)

VALID: dict[str, Any] = {
    "url": "https://example.com/hook",
    "idempotency_key": "order-1",
    "json": {"a": 1},
}


def arguments(**overrides: Any) -> dict[str, Any]:
    """Every keyword argument of ``Outbox.enqueue``: ``VALID`` with ``overrides``."""
    return {
        "json": None,
        "body": None,
        "content_type": None,
        "method": "POST",
        "headers": None,
        "ordering_key": None,
        "available_at": None,
        "max_attempts": None,
        **VALID,
        **overrides,
    }


def build(box: Outbox | None = None, **overrides: Any) -> NewMessage:
    """Validate the arguments with ``box``'s settings, as ``Outbox.enqueue`` does."""
    box = box or Outbox()
    return build_message(
        **arguments(**overrides),
        default_max_attempts=box.max_attempts,
        max_body_bytes=box.max_body_bytes,
    )


def rejected(field: str, box: Outbox | None = None, **overrides: Any) -> InvalidMessage:
    """Assert that ``overrides`` are rejected for ``field``; return the error.

    ``Outbox.enqueue`` must reject them too before it looks at its transaction: an
    object that is no transaction at all gets InvalidMessage, not TypeError.
    """
    box = box or Outbox()
    with pytest.raises(InvalidMessage) as info:
        build(box, **overrides)
    error = info.value
    with pytest.raises(InvalidMessage) as via_enqueue:
        box.enqueue(object(), **arguments(**overrides))
    assert via_enqueue.value.field == field
    assert error.field == field
    assert str(error).startswith(f"{field}: ")
    assert error.problem and error.problem in str(error)
    assert isinstance(error, OutboxError)
    assert isinstance(error, ValueError)
    return error


# -- url ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "gopher://example.com/",
        "example.com/hook",
        "//example.com/hook",
    ],
)
def test_url_without_http_scheme_is_rejected(url: str) -> None:
    error = rejected("url", url=url)
    assert "http or https" in error.problem


@pytest.mark.parametrize("url", ["http://", "https:///path", "http://:8080/x", "http://?q=1"])
def test_url_without_host_is_rejected(url: str) -> None:
    error = rejected("url", url=url)
    assert "host" in error.problem


@pytest.mark.parametrize(
    "url",
    [
        "https://user:secret@example.com/hook",
        "https://user@example.com/hook",
        "https://:secret@example.com/hook",
    ],
)
def test_url_with_userinfo_is_rejected(url: str) -> None:
    error = rejected("url", url=url)
    assert "credentials" in error.problem
    assert "secret" not in str(error)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a b",
        " https://example.com/",
        "https://example.com/\n",
        "https://example.com/\r\nX-Injected: 1",
        "https://example.com/\t",
        "https://example.com/\x00",
        "https://example.com/\x7f",
        "https://exämple.com/",
    ],
)
def test_url_with_spaces_or_control_characters_is_rejected(url: str) -> None:
    error = rejected("url", url=url)
    assert "spaces, control or non-ASCII" in error.problem


@pytest.mark.parametrize(
    "url", ["https://example.com/hook#frag", "https://example.com/#", "https://example.com#x"]
)
def test_url_with_fragment_is_rejected(url: str) -> None:
    error = rejected("url", url=url)
    assert "fragment" in error.problem


def test_url_longer_than_the_limit_is_rejected() -> None:
    base = "https://example.com/"
    longest = base + "a" * (MAX_URL_LENGTH - len(base))
    assert build(url=longest).url == longest
    error = rejected("url", url=longest + "a")
    assert str(MAX_URL_LENGTH) in error.problem


@pytest.mark.parametrize("url", ["", None, b"https://example.com/", 42])
def test_url_that_is_not_a_non_empty_string_is_rejected(url: object) -> None:
    rejected("url", url=url)


@pytest.mark.parametrize(
    "url", ["https://example.com:99999/", "https://example.com:abc/", "http://[::1/"]
)
def test_url_that_does_not_parse_is_rejected(url: str) -> None:
    rejected("url", url=url)


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://127.1/", "127.0.0.1"),
        ("http://2130706433/", "127.0.0.1"),
        ("http://017700000001/", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1"),
        ("http://0X7F000001:8080/x", "127.0.0.1"),
        ("http://127.000.0.1/", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1"),
        ("https://10.1/", "10.0.0.1"),
        ("http://0/", "0.0.0.0"),
        ("http://127.0.0.1./", "127.0.0.1"),
    ],
)
def test_url_with_an_ipv4_host_in_a_non_canonical_form_is_rejected(
    url: str, canonical: str
) -> None:
    error = rejected("url", url=url)
    assert "non-canonical" in error.problem and canonical in error.problem


@pytest.mark.parametrize(
    "url",
    ["http://1.2.3.4.5/", "http://256.1.1.1/", "http://example.123/", "http://1.2.3.0x/"],
)
def test_url_with_a_numeric_host_that_is_no_ipv4_address_is_rejected(url: str) -> None:
    error = rejected("url", url=url)
    assert "not a valid IPv4 address" in error.problem


def test_url_with_a_percent_encoded_host_is_rejected() -> None:
    error = rejected("url", url="http://127%2e0.0.1/")
    assert "percent" in error.problem


def test_url_with_port_zero_is_rejected() -> None:
    rejected("url", url="https://example.com:0/")


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com",
        "HTTPS://Example.COM:8443/a/b?x=1&y=%20",
        "http://127.0.0.1:8080/hook",
        "http://[::1]:8080/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://1e100.net/",
        "http://0x.example/",
        "http://8.8.8.8/",
    ],
)
def test_absolute_http_urls_are_accepted_unchanged(url: str) -> None:
    message = build(url=url)
    assert message.url == url
    assert message.target == url
    assert message.endpoint_id is None


# -- headers -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["X Space", "X:Colon", "X(paren)", "X/Slash", 'X"Quote', "X@At"])
def test_header_name_that_is_not_a_token_is_rejected(name: str) -> None:
    error = rejected(f"headers[{name}]", headers={name: "v"})
    assert "header name" in error.problem


@pytest.mark.parametrize("name", ["X-A\r", "X-A\n", "X-A\r\nX-B", "\nX-A", "X-A\x00", "X-\u00c4"])
def test_header_name_with_cr_lf_nul_or_non_ascii_is_rejected_and_shown_escaped(name: str) -> None:
    error = rejected(f"headers[{name!r}]", headers={name: "v"})
    assert "\r" not in str(error)
    assert "\n" not in str(error)


@pytest.mark.parametrize("name", ["", 7, None, b"X-A"])
def test_header_name_that_is_not_a_non_empty_string_is_rejected(name: object) -> None:
    rejected("headers", headers={name: "v"})


@pytest.mark.parametrize(
    "value",
    [
        "a\rb",
        "a\nb",
        "a\r\nX-Injected: 1",
        "trailing\n",
        "trailing\r\n",
        "\nleading",
        "nul\x00",
        "bell\x07",
        "del\x7f",
        "caf\u00e9",
        "snow\u2603",
    ],
)
def test_header_value_with_cr_lf_nul_control_or_non_ascii_is_rejected(value: str) -> None:
    error = rejected("headers[X-Custom]", headers={"X-Custom": value})
    assert "printable ASCII" in error.problem


def test_header_value_that_is_not_a_string_is_rejected() -> None:
    rejected("headers[X-Count]", headers={"X-Count": 3})


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "host",
        "HOST",
        "Content-Length",
        "Transfer-Encoding",
        "transfer-encoding",
        "Connection",
        "Idempotency-Key",
        "IDEMPOTENCY-KEY",
        "Content-Type",
        "content-type",
        "webhook-id",
        "Webhook-Id",
        "Webhook-Signature",
        "WEBHOOK-TIMESTAMP",
        "Keep-Alive",
        "Upgrade",
        "TE",
    ],
)
def test_reserved_header_is_rejected_whatever_its_case(name: str) -> None:
    error = rejected(f"headers[{name}]", headers={name: "x"})
    assert "set by the outbox itself" in error.problem


def test_content_type_header_points_at_the_content_type_argument() -> None:
    error = rejected("headers[Content-Type]", headers={"Content-Type": "text/plain"})
    assert "content_type=" in error.problem


def test_header_names_differing_only_in_case_are_rejected() -> None:
    error = rejected("headers[x-trace]", headers={"X-Trace": "1", "x-trace": "2"})
    assert "more than once" in error.problem


def test_headers_that_are_not_a_mapping_are_rejected() -> None:
    rejected("headers", headers=[("X-A", "1")])


def test_too_many_headers_are_rejected() -> None:
    rejected("headers", headers={f"X-H{i}": "v" for i in range(65)})


def test_valid_headers_are_kept_as_given() -> None:
    headers = {"X-Trace": "abc\t123", "Authorization": "Bearer t0k3n", "X-Empty": ""}
    message = build(headers=headers)
    assert message.headers == headers
    assert message.headers is not headers
    assert json.loads(message.params()["headers"]) == headers


# -- idempotency key, ordering key ---------------------------------------------------


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "must not be empty"),
        ("k" * 256, "longer than 255"),
        ("tab\tkey", "printable ASCII"),
        ("new\nline", "printable ASCII"),
        ("trailing-newline\n", "printable ASCII"),
        ("cr\r", "printable ASCII"),
        ("nul\x00", "printable ASCII"),
        ("caf\u00e9", "printable ASCII"),
        (" leading", "start or end with a space"),
        ("trailing ", "start or end with a space"),
        (None, "must be a string"),
        (42, "must be a string"),
    ],
)
def test_bad_idempotency_key_is_rejected(key: object, problem: str) -> None:
    error = rejected("idempotency_key", idempotency_key=key)
    assert problem in error.problem


def test_idempotency_key_of_255_printable_characters_is_accepted() -> None:
    key = "k" * 254 + "~"
    assert build(idempotency_key=key).idempotency_key == key
    assert build(idempotency_key="a b").idempotency_key == "a b"


@pytest.mark.parametrize("key", ["", "o" * 256, "line\n", " x"])
def test_bad_ordering_key_is_rejected(key: str) -> None:
    rejected("ordering_key", ordering_key=key)


def test_ordering_key_is_optional() -> None:
    assert build().ordering_key is None
    assert build(ordering_key="customer-7").ordering_key == "customer-7"


# -- json / body -------------------------------------------------------------------


def test_both_json_and_body_are_rejected() -> None:
    error = rejected("json", json={"a": 1}, body=b"x")
    assert "exactly one of json= or body=" in error.problem


def test_neither_json_nor_body_is_rejected() -> None:
    error = rejected("json", json=None, body=None)
    assert "exactly one of json= or body=" in error.problem


@pytest.mark.parametrize(
    "value",
    [
        object(),
        float("nan"),
        float("inf"),
        float("-inf"),
        {"nested": [1, {"x": float("nan")}]},
        {"set": {1, 2}},
        {"bytes": b"x"},
        {(1, 2): "tuple key"},
        "\ud800",
    ],
)
def test_json_that_is_not_serialisable_is_rejected(value: object) -> None:
    error = rejected("json", json=value)
    assert "not JSON serialisable" in error.problem


def test_json_with_a_reference_cycle_is_rejected() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    rejected("json", json=cycle)


def test_body_of_another_type_is_rejected() -> None:
    error = rejected("body", json=None, body=12)
    assert "bytes or str" in error.problem


def test_body_over_the_limit_is_rejected() -> None:
    box = Outbox(max_body_bytes=10)
    assert build(box, json=None, body=b"x" * 10).body == b"x" * 10
    error = rejected("body", box, json=None, body=b"x" * 11)
    assert error.problem == "is 11 bytes, over the limit of 10 bytes"


def test_str_body_over_the_limit_is_measured_in_utf8_bytes() -> None:
    box = Outbox(max_body_bytes=10)
    # 5 characters, 10 bytes: accepted; one more character: 12 bytes, rejected.
    assert build(box, json=None, body="\u00e9" * 5).body == "\u00e9".encode() * 5
    error = rejected("body", box, json=None, body="\u00e9" * 6)
    assert error.problem == "is 12 bytes, over the limit of 10 bytes"


def test_json_over_the_limit_is_rejected_for_json() -> None:
    box = Outbox(max_body_bytes=10)
    assert build(box, json=[1, 2, 3, 40]).body == b"[1,2,3,40]"
    error = rejected("json", box, json=[1, 2, 3, 4, 5])
    assert error.problem == "is 11 bytes, over the limit of 10 bytes"


def test_json_is_encoded_compactly_as_utf8_with_its_content_type() -> None:
    message = build(json={"b": [1, 2.5, None, True], "a": "\u00e9\u2603"})
    assert message.body == '{"b":[1,2.5,null,true],"a":"\u00e9\u2603"}'.encode()
    assert message.content_type == "application/json"


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(0, b"0"), (False, b"false"), ("", b'""'), ([], b"[]"), ({}, b"{}")],
)
def test_falsy_json_values_are_sent_not_mistaken_for_no_body(value: object, encoded: bytes) -> None:
    assert build(json=value).body == encoded


def test_str_body_is_sent_as_utf8_text() -> None:
    message = build(json=None, body="h\u00e9llo \u2603")
    assert message.body == "h\u00e9llo \u2603".encode()
    assert message.content_type == "text/plain; charset=utf-8"


def test_str_body_that_is_not_valid_unicode_is_rejected() -> None:
    rejected("body", json=None, body="\udcff")


@pytest.mark.parametrize("body", [b"\x00\xff", bytearray(b"\x00\xff"), memoryview(b"\x00\xff")])
def test_binary_body_is_sent_as_octet_stream(body: bytes | bytearray | memoryview) -> None:
    message = build(json=None, body=body)
    assert message.body == b"\x00\xff"
    assert type(message.body) is bytes
    assert message.content_type == "application/octet-stream"


def test_empty_body_is_accepted() -> None:
    message = build(json=None, body=b"")
    assert message.body == b""


@pytest.mark.parametrize(
    "content_type",
    [
        "application/cloudevents+json",
        "text/csv; charset=utf-8",
        "application/x-www-form-urlencoded",
    ],
)
def test_explicit_content_type_is_kept(content_type: str) -> None:
    assert build(content_type=content_type).content_type == content_type
    assert build(json=None, body=b"x", content_type=content_type).content_type == content_type


@pytest.mark.parametrize(
    "content_type",
    [
        "",
        "json",
        "application/",
        "/json",
        "text/plain\r\nX-Injected: 1",
        "text/plain\n",
        "text/plain; charset=\u00e9",
        "text/plain; a=\x00",
        "x/" + "y" * 300,
        42,
    ],
)
def test_bad_content_type_is_rejected(content_type: object) -> None:
    error = rejected("content_type", content_type=content_type)
    assert "media type" in error.problem


# -- max_attempts, available_at, method --------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, "between 1 and 1000"),
        (-1, "between 1 and 1000"),
        (1001, "between 1 and 1000"),
        (True, "must be an integer"),
        (False, "must be an integer"),
        ("3", "must be an integer"),
        (3.0, "must be an integer"),
    ],
)
def test_bad_max_attempts_is_rejected(value: object, problem: str) -> None:
    error = rejected("max_attempts", max_attempts=value)
    assert problem in error.problem


def test_max_attempts_defaults_to_the_outbox_setting() -> None:
    assert build().max_attempts == 12
    assert build(Outbox(max_attempts=3)).max_attempts == 3
    assert build(max_attempts=1).max_attempts == 1
    assert build(max_attempts=1000).max_attempts == 1000


def test_naive_available_at_is_rejected() -> None:
    error = rejected("available_at", available_at=datetime(2030, 1, 1, 12, 0))
    assert "timezone-aware" in error.problem


def test_available_at_that_is_not_a_datetime_is_rejected() -> None:
    rejected("available_at", available_at="2030-01-01T00:00:00Z")
    rejected("available_at", available_at=1_900_000_000)


def test_aware_available_at_is_kept() -> None:
    when = datetime(2030, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    assert build(available_at=when).available_at == when
    assert build().available_at is None


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-14))),
    ],
)
def test_available_at_outside_its_window_is_rejected(when: datetime) -> None:
    rejected("available_at", available_at=when)


def test_available_at_past_the_window_from_now_is_rejected() -> None:
    error = rejected(
        "available_at", available_at=datetime.now(UTC) + MAX_SCHEDULE_AHEAD + timedelta(minutes=1)
    )
    assert "10 years" in error.problem


def test_available_at_at_the_edges_of_its_window_is_kept() -> None:
    for when in (
        EARLIEST_AVAILABLE_AT,
        datetime.now(UTC) + MAX_SCHEDULE_AHEAD - timedelta(hours=1),
    ):
        assert build(available_at=when).available_at == when


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "TRACE", "CONNECT", "", "P OST", None, 1])
def test_bad_method_is_rejected(method: object) -> None:
    error = rejected("method", method=method)
    assert error.problem == "must be one of DELETE, GET, PATCH, POST, PUT"


@pytest.mark.parametrize(
    ("method", "sent"),
    [("get", "GET"), ("Post", "POST"), ("put", "PUT"), ("patch", "PATCH"), ("DELETE", "DELETE")],
)
def test_method_is_upper_cased(method: str, sent: str) -> None:
    assert build(method=method).method == sent


# -- order and result --------------------------------------------------------------


def test_the_url_is_reported_before_other_bad_fields() -> None:
    rejected("url", url="ftp://x", idempotency_key="", method="HEAD")


def test_a_valid_message_has_the_parameters_of_the_enqueue_statement() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    message = build(
        url="https://example.com/pay",
        idempotency_key="pay-9",
        json={"amount": 5},
        method="put",
        headers={"X-Tenant": "t1"},
        ordering_key="acct-1",
        available_at=when,
        max_attempts=4,
    )
    assert message.params() == {
        "idempotency_key": "pay-9",
        "target": "https://example.com/pay",
        "destination": "https://example.com:443",
        "endpoint_id": None,
        "url": "https://example.com/pay",
        "method": "PUT",
        "headers": '{"X-Tenant":"t1"}',
        "body": b'{"amount":5}',
        "content_type": "application/json",
        "event_type": None,
        "ordering_key": "acct-1",
        "state": "ready",
        "max_attempts": 4,
        "available_at": when,
        "digest": request_digest(
            method="PUT",
            url="https://example.com/pay",
            headers={"X-Tenant": "t1"},
            content_type="application/json",
            body=b'{"amount":5}',
        ),
        "trace_context": None,
    }


# -- destination -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "destination"),
    [
        ("https://example.com/pay", "https://example.com:443"),
        ("HTTPS://Example.COM:443/pay?x=1", "https://example.com:443"),
        ("http://example.com", "http://example.com:80"),
        ("http://example.com:/a", "http://example.com:80"),
        ("http://example.com:8080/a", "http://example.com:8080"),
        ("https://example.com:0443/a", "https://example.com:443"),
        ("http://[2001:DB8::1]:8080/a", "http://[2001:db8::1]:8080"),
        ("https://[::1]/a", "https://[::1]:443"),
        ("http://127.0.0.1:9/x", "http://127.0.0.1:9"),
    ],
)
def test_the_destination_is_the_origin_of_the_url_in_one_spelling(
    url: str, destination: str
) -> None:
    assert build(url=url).destination == destination


def nested(depth: int) -> object:
    """A value that nests ``depth`` lists (built without recursion)."""
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [2_000, 100_000])
@pytest.mark.slow
def test_json_nested_past_the_encoder_is_rejected_not_a_recursion_error(depth: int) -> None:
    """A body is bytes to the outbox: deep JSON is the receiver's to refuse, but the
    encoder's RecursionError must not escape enqueue."""
    assert "not JSON serialisable" in rejected("json", json=nested(depth)).problem


def test_json_nested_as_deep_as_a_receiver_parses_is_sent() -> None:
    assert build(json=nested(200)).body == b"[" * 200 + b"]" * 200


# -- what each refusal says, and the bounds that are kept ---------------------------


class _NoOffset(tzinfo):
    """A time zone that knows no offset: as naive as no time zone at all."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"url": 42}, "url: must be a string, not int"),
        ({"url": ""}, "url: must not be empty"),
        ({"url": "ftp://example.com/"}, "url: must use the http or https scheme"),
        (
            {"url": "https://user:pw@example.com/"},
            "url: must not contain credentials (user:password@); use headers",
        ),
        ({"url": "https:///path"}, "url: must include a host"),
        ({"url": "https://exa%6dple.com/"}, "url: must not percent-encode its host"),
        ({"url": "https://example.com:0/"}, "url: port 0 is not a valid destination"),
        (
            {"url": "https://example.com/#top"},
            "url: must not contain a fragment (#...); it is never sent",
        ),
        ({"idempotency_key": 42}, "idempotency_key: must be a string, not int"),
        ({"idempotency_key": ""}, "idempotency_key: must not be empty"),
        (
            {"idempotency_key": "caf\u00e9"},
            "idempotency_key: must contain only printable ASCII characters",
        ),
        ({"idempotency_key": " x"}, "idempotency_key: must not start or end with a space"),
        ({"headers": [("X-A", "1")]}, "headers: must be a mapping of header names to values"),
        ({"headers": {"": "1"}}, "headers: header names must be non-empty strings"),
        ({"headers": {"X A": "1"}}, "headers[X A]: is not a valid HTTP header name"),
        ({"headers": {"Host": "x"}}, "headers[Host]: is set by the outbox itself"),
        (
            {"headers": {"Content-Type": "x"}},
            "headers[Content-Type]: is set by the outbox itself (use content_type=)",
        ),
        ({"headers": {"X-A": "1", "x-a": "2"}}, "headers[x-a]: is given more than once"),
        ({"headers": {"X-A": 1}}, "headers[X-A]: value must be a string"),
        (
            {"headers": {"X-A": "v" * (MAX_HEADER_VALUE + 1)}},
            f"headers[X-A]: value is longer than {MAX_HEADER_VALUE}",
        ),
        (
            {"headers": {"X-A": "a\nb"}},
            "headers[X-A]: value must be printable ASCII (no CR, LF or other control characters)",
        ),
        ({"json": {"a": 1}, "body": b"x"}, "json: give exactly one of json= or body="),
        ({"json": None, "body": "\udc80"}, "body: is not valid Unicode text"),
        ({"json": None, "body": 42}, "body: must be bytes or str, not int"),
        (
            {"content_type": "nonsense"},
            "content_type: must be a media type such as application/json",
        ),
        ({"max_attempts": "3"}, "max_attempts: must be an integer"),
        ({"available_at": "2030-01-01"}, "available_at: must be a datetime"),
        (
            {"available_at": datetime(2030, 1, 1)},
            "available_at: must be timezone-aware (naive datetimes are ambiguous)",
        ),
        (
            {"available_at": datetime(2030, 1, 1, tzinfo=_NoOffset())},
            "available_at: must be timezone-aware (naive datetimes are ambiguous)",
        ),
    ],
)
def test_each_refusal_says_what_is_wrong(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        build(**overrides)
    assert str(refused.value) == message


def test_headers_at_their_bounds_are_kept() -> None:
    many = {f"X-H{i}": "v" for i in range(MAX_HEADERS)}
    assert build(headers=many).headers == many
    longest = {"X" * MAX_HEADER_NAME: "v" * MAX_HEADER_VALUE}
    assert build(headers=longest).headers == longest


def test_a_content_type_of_255_characters_is_kept_and_of_256_refused() -> None:
    longest = "application/" + "x" * (255 - len("application/"))
    assert build(content_type=longest).content_type == longest
    rejected("content_type", content_type=longest + "x")


def test_a_key_may_start_and_end_with_any_printable_character_but_a_space() -> None:
    assert build(idempotency_key="X-1-X").idempotency_key == "X-1-X"


def test_no_headers_are_written_as_an_empty_json_object() -> None:
    assert build().params()["headers"] == "{}"


class _Frozen(datetime):
    """The clock of outbox._message, stopped at a moment."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> _Frozen:
        return cls(2030, 1, 1, tzinfo=UTC)


def test_available_at_exactly_the_furthest_ahead_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("outbox._message.datetime", _Frozen)
    furthest = _Frozen.now(UTC) + MAX_SCHEDULE_AHEAD
    assert build(available_at=furthest).available_at == furthest
    rejected("available_at", available_at=furthest + timedelta(microseconds=1))


@pytest.mark.parametrize("setting", ["max_attempts", "webhook_max_attempts"])
@pytest.mark.parametrize("value", [0, -1, MAX_ATTEMPTS_LIMIT + 1, True, 2.0, "3", None])
def test_an_outbox_attempt_budget_out_of_range_is_a_configuration_error_naming_it(
    setting: str, value: object
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Outbox(**{setting: value})
    assert str(caught.value).startswith(f"{setting}: must be")
    assert not isinstance(caught.value, InvalidMessage)


@pytest.mark.parametrize("setting", ["max_attempts", "webhook_max_attempts"])
def test_an_outbox_attempt_budget_keeps_each_bound(setting: str) -> None:
    assert getattr(Outbox(**{setting: 1}), setting) == 1
    assert getattr(Outbox(**{setting: MAX_ATTEMPTS_LIMIT}), setting) == MAX_ATTEMPTS_LIMIT
