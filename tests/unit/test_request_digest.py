"""The digest stored with an idempotency key: what makes two requests the same."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest

from outbox._digest import event_digest, request_digest
from outbox._message import build_message

REQUEST: dict[str, Any] = {
    "method": "POST",
    "url": "https://example.com/pay",
    "headers": {"X-Tenant": "t1", "Accept": "*/*"},
    "content_type": "application/json",
    "body": b'{"amount":5}',
}


def digest(**changed: Any) -> bytes:
    return request_digest(**{**REQUEST, **changed})


def field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def test_the_digest_is_sha256_of_the_documented_encoding() -> None:
    encoded = (
        b"outbox.request.v1"
        + field(b"POST")
        + field(b"https://example.com/pay")
        + field(b"application/json")
        + field(b'{"amount":5}')
        + (2).to_bytes(8, "big")
        + field(b"accept")
        + field(b"*/*")
        + field(b"x-tenant")
        + field(b"t1")
    )
    assert digest() == hashlib.sha256(encoded).digest()


def test_header_names_compare_in_any_case_and_any_order() -> None:
    assert digest(headers={"accept": "*/*", "X-TENANT": "t1"}) == digest()


@pytest.mark.parametrize(
    "changed",
    [
        {"method": "PUT"},
        {"url": "https://example.com/pay?x=1"},
        {"headers": {"X-Tenant": "t2", "Accept": "*/*"}},
        {"headers": {"X-Tenant": "t1"}},
        {"headers": {"X-Tenant": "t1", "Accept": "*/*", "X-More": ""}},
        {"content_type": "text/plain"},
        {"body": b'{"amount":6}'},
        {"body": b""},
    ],
)
def test_any_change_to_what_is_sent_changes_the_digest(changed: dict[str, Any]) -> None:
    assert digest(**changed) != digest()


@pytest.mark.parametrize(
    ("one", "other"),
    [
        # bytes moved across the boundary of two fields
        ({"content_type": "a/b", "body": b"cd"}, {"content_type": "a/bc", "body": b"d"}),
        ({"headers": {"x-a": "bc"}}, {"headers": {"x-ab": "c"}}),
        # one header whose value looks like two
        ({"headers": {"x-a": "1", "x-b": "2"}}, {"headers": {"x-a": "1\x00\x00x-b2"}}),
    ],
)
def test_no_two_requests_encode_alike(one: dict[str, Any], other: dict[str, Any]) -> None:
    assert digest(**one) != digest(**other)


def test_what_only_schedules_a_request_is_not_part_of_it() -> None:
    def built(**schedule: Any) -> bytes:
        return build_message(
            url="https://example.com/pay",
            idempotency_key="k",
            json={"amount": 5},
            body=None,
            content_type=None,
            method="post",
            headers={"X-Tenant": "t1"},
            default_max_attempts=12,
            max_body_bytes=1024,
            **{"ordering_key": None, "available_at": None, "max_attempts": None, **schedule},
        ).digest

    assert (
        built()
        == built(ordering_key="acct-1")
        == built(available_at=datetime(2030, 1, 1, tzinfo=UTC))
        == built(max_attempts=3)
        == digest(headers={"X-Tenant": "t1"})
    )


def test_an_event_is_its_type_and_its_payload() -> None:
    event = event_digest(event_type="order.paid", payload=b'{"n":1}')
    assert event == event_digest(event_type="order.paid", payload=b'{"n":1}')
    assert event != event_digest(event_type="order.paid", payload=b'{"n":2}')
    assert event != event_digest(event_type="order.paidx", payload=b'{"n":1}')
    # an event never digests like a request, whatever their bytes
    assert event != request_digest(
        method="", url="", headers={}, content_type="order.paid", body=b'{"n":1}'
    )
