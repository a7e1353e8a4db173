"""Validation of endpoints, subscriptions, secrets and published events, without a database.

Every rejection raises :class:`outbox.InvalidMessage` naming the argument at fault,
before any statement runs: the transaction handed in here is a bare ``object()``,
which the library would refuse with ``TypeError`` had validation let the call through.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from outbox import InvalidMessage, Outbox
from outbox._endpoint_fields import (
    MAX_METADATA_BYTES,
    check_event_type,
    check_metadata,
    check_subscriptions,
)
from outbox._storable import MAX_JSON_DEPTH
from outbox.endpoints import Endpoint, Endpoints, Secret
from outbox.secrets import (
    GENERATED_KEY_BYTES,
    MAX_KEY_BYTES,
    MIN_KEY_BYTES,
    SECRET_PREFIX,
    check_secret,
    generate_secret,
    parse_secret,
)
from tests.errors import invalid_argument

NO_TX = object()


def secret_of(size: int) -> str:
    return SECRET_PREFIX + base64.b64encode(bytes(range(size))).decode()


# -- event types and subscriptions ------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["a", "order.created", "Order_Created-v2", "x" * 255, "a.b.c.d", "~!#$%&"]
)
def test_event_type_accepts_printable_names_up_to_255(value: str) -> None:
    assert check_event_type(value) == value


@pytest.mark.parametrize(
    "value", ["", " ", "order created", "order\tcreated", "x" * 256, "é", "a\n", "order.*", "*"]
)
def test_event_type_refuses_empty_whitespace_long_and_wildcards(value: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        check_event_type(value)
    assert caught.value.field == "event_type"
    assert str(caught.value).startswith("event_type:")


@pytest.mark.parametrize("value", [None, 1, b"order.created", ["order.created"]])
def test_event_type_must_be_a_string(value: object) -> None:
    with pytest.raises(InvalidMessage, match=r"^event_type:"):
        check_event_type(value)


def test_subscriptions_accept_exact_names_and_prefix_patterns() -> None:
    assert check_subscriptions(None) == []
    assert check_subscriptions([]) == []
    assert check_subscriptions(["order.*", "invoice.paid", "order.*"]) == [
        "order.*",
        "invoice.paid",
    ]
    assert check_subscriptions(t for t in ("a.b.*", "a")) == ["a.b.*", "a"]


@pytest.mark.parametrize(
    "value",
    [
        "order.created",  # a string, not a list of them
        42,
        ["*"],
        [".*"],
        ["order.*.*"],
        ["order*"],
        ["*.created"],
        ["order created"],
        [""],
        ["x" * 256],
        [None],
    ],
)
def test_subscriptions_refuse_anything_else(value: object) -> None:
    with pytest.raises(InvalidMessage) as caught:
        check_subscriptions(value)
    assert caught.value.field == "event_types"


# -- secrets ----------------------------------------------------------------------------


def test_generated_secrets_are_whsec_and_32_random_bytes() -> None:
    secrets = {generate_secret() for _ in range(20)}
    assert len(secrets) == 20
    for secret in secrets:
        assert secret.startswith(SECRET_PREFIX)
        assert len(parse_secret(secret)) == GENERATED_KEY_BYTES
        assert check_secret(secret) == secret


def test_secret_bounds_and_unpadded_base64() -> None:
    assert len(parse_secret(secret_of(MIN_KEY_BYTES))) == MIN_KEY_BYTES
    assert len(parse_secret(secret_of(MAX_KEY_BYTES))) == MAX_KEY_BYTES
    padded = secret_of(25)
    assert padded.endswith("=")
    assert parse_secret(padded.rstrip("=")) == parse_secret(padded)


@pytest.mark.parametrize(
    "secret",
    [
        None,
        b"whsec_AAAA",
        "",
        "whsec_",
        "sk_" + secret_of(32)[len(SECRET_PREFIX) :],
        secret_of(32)[len(SECRET_PREFIX) :],  # no prefix
        secret_of(MIN_KEY_BYTES - 1),
        secret_of(MAX_KEY_BYTES + 1),
        secret_of(32) + "!",
        secret_of(32).replace("A", "-", 1) + "-",
        secret_of(32) + "===",
        SECRET_PREFIX + " " + secret_of(32)[len(SECRET_PREFIX) :],
    ],
)
def test_malformed_secrets_are_refused_without_echoing_them(secret: object) -> None:
    with pytest.raises(InvalidMessage) as caught:
        parse_secret(secret)
    assert caught.value.field == "secret"
    if isinstance(secret, str) and len(secret) > len(SECRET_PREFIX):
        assert secret[len(SECRET_PREFIX) :] not in str(caught.value)


# -- the Endpoints API refuses before any statement ------------------------------------


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("url", {"url": "ftp://example.com/x"}),
        ("url", {"url": ""}),
        ("url", {"url": "https://example.com/x#frag"}),
        ("url", {"url": 42}),
        ("secret", {"secret": "whsec_short"}),
        ("secret", {"secret": "not-a-secret"}),
        ("event_types", {"event_types": ["a b"]}),
        ("event_types", {"event_types": "order.created"}),
        ("description", {"description": "x" * 1001}),
        ("description", {"description": None}),
        ("metadata", {"metadata": ["not", "a", "mapping"]}),
        ("metadata", {"metadata": {"x": float("nan")}}),
        ("max_concurrency", {"max_concurrency": 0}),
        ("max_concurrency", {"max_concurrency": True}),
        ("max_concurrency", {"max_concurrency": 10_001}),
    ],
)
def test_add_refuses_bad_input_before_any_statement(field: str, kwargs: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"url": "https://example.com/hook"} | kwargs
    with pytest.raises(InvalidMessage) as caught:
        Endpoints().add(NO_TX, **arguments)
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ":")


def test_the_transaction_is_reached_only_with_valid_input() -> None:
    with pytest.raises(TypeError, match="tx must be"):
        Endpoints().add(NO_TX, url="https://example.com/hook")


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("url", {"url": "mailto:someone@example.com"}),
        ("event_types", {"event_types": ["*"]}),
        ("description", {"description": "x" * 1001}),
        ("metadata", {"metadata": {"x": object()}}),
        ("max_concurrency", {"max_concurrency": -1}),
    ],
)
def test_update_refuses_bad_input_before_any_statement(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessage) as caught:
        Endpoints().update(NO_TX, 1, **kwargs)
    assert caught.value.field == field


def test_rotate_and_disable_refuse_bad_input_before_any_statement() -> None:
    endpoints = Endpoints()
    with pytest.raises(InvalidMessage, match=r"^secret:"):
        endpoints.rotate_secret(NO_TX, 1, secret="whsec_short")
    with invalid_argument("overlap"):
        endpoints.rotate_secret(NO_TX, 1, overlap=timedelta(seconds=-1))
    for reason in ("", "x" * 1001, None):
        with pytest.raises(InvalidMessage, match=r"^reason:"):
            endpoints.disable(NO_TX, 1, reason=reason)  # type: ignore[arg-type]


# -- publish refuses before any statement -------------------------------------------------


@pytest.mark.parametrize(
    ("field", "event_type", "payload", "kwargs"),
    [
        ("event_type", "", {}, {}),
        ("event_type", " ", {}, {}),
        ("event_type", "x" * 256, {}, {}),
        ("event_type", "order.*", {}, {}),
        ("event_type", 7, {}, {}),
        ("payload", "order.created", {"x": object()}, {}),
        ("payload", "order.created", {"x": float("inf")}, {}),
        ("payload", "order.created", {1j}, {}),
        ("idempotency_key", "order.created", {}, {"idempotency_key": "k" * 201}),
        ("idempotency_key", "order.created", {}, {"idempotency_key": " padded "}),
        ("ordering_key", "order.created", {}, {"ordering_key": ""}),
    ],
)
def test_publish_refuses_bad_input_naming_the_field(
    field: str, event_type: Any, payload: Any, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidMessage) as caught:
        Outbox().publish(NO_TX, event_type, payload, **kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ":")


def test_publish_payload_size_is_bounded_by_max_body_bytes() -> None:
    box = Outbox(max_body_bytes=100)
    with pytest.raises(InvalidMessage, match=r"^payload:.*over the limit"):
        box.publish(NO_TX, "order.created", "x" * 100)
    with pytest.raises(TypeError, match="tx must be"):  # a small one passes validation
        box.publish(NO_TX, "order.created", "x")


def test_event_key_of_200_characters_is_accepted() -> None:
    with pytest.raises(TypeError, match="tx must be"):
        Outbox().publish(NO_TX, "order.created", {}, idempotency_key="k" * 200)


# -- the Endpoint value ---------------------------------------------------------------------


def endpoint(secrets: list[Secret]) -> Endpoint:
    now = datetime.now(UTC)
    return Endpoint(
        id=1,
        url="https://example.com/hook",
        description="",
        event_types=[],
        secrets=secrets,
        metadata={},
        enabled=True,
        disabled_reason=None,
        disabled_at=None,
        failure_streak=0,
        failing_since=None,
        last_success_at=None,
        max_concurrency=None,
        created_at=now,
        updated_at=now,
    )


def test_active_secrets_drop_expired_ones() -> None:
    now = datetime.now(UTC)
    new, old, expired = generate_secret(), generate_secret(), generate_secret()
    value = endpoint(
        [
            Secret(new),
            Secret(old, now + timedelta(hours=1)),
            Secret(expired, now - timedelta(seconds=1)),
        ]
    )
    assert value.active_secrets(now) == [new, old]
    assert value.active_secrets(now + timedelta(hours=2)) == [new]


def test_as_dict_masks_secrets_unless_asked_and_repr_never_shows_them() -> None:
    secret = generate_secret()
    value = endpoint([Secret(secret)])
    masked = value.as_dict()
    text = json.dumps(masked, default=str)
    assert secret not in text
    assert secret[len(SECRET_PREFIX) :] not in text
    assert masked["secrets"][0]["secret"].startswith(SECRET_PREFIX)
    assert value.as_dict(show_secrets=True)["secrets"] == [
        {"secret": secret, "expires_at": None, "key_id": None}
    ]
    assert secret not in repr(value)
    assert secret not in repr(Secret(secret))


# -- metadata and payloads: bounded, and storable as jsonb -----------------------------


def deep(depth: int, leaf: object = 1) -> object:
    """``{"a": {"a": ... leaf}}``, ``depth`` objects deep (built without recursion)."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 200_000])
@pytest.mark.slow
def test_metadata_nested_too_deep_is_refused_naming_it(depth: int) -> None:
    for call in (
        lambda: Endpoints().add(NO_TX, url="https://example.com/h", metadata=deep(depth)),
        lambda: Endpoints().update(NO_TX, 1, metadata=deep(depth)),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidMessage, match=f"deeper than {MAX_JSON_DEPTH} levels") as refused:
            call()
        assert refused.value.field == "metadata"


def test_metadata_as_deep_as_allowed_is_accepted() -> None:
    assert check_metadata(deep(MAX_JSON_DEPTH - 1)) == deep(MAX_JSON_DEPTH - 1)


def test_metadata_larger_than_its_bound_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="bytes of JSON"):
        check_metadata({"a": "x" * MAX_METADATA_BYTES})
    with pytest.raises(InvalidMessage, match=r"more than .* values"):
        check_metadata({"a": [0] * MAX_METADATA_BYTES})


def test_metadata_that_refers_to_itself_is_refused_without_recursing() -> None:
    cycle: dict[str, object] = {}
    cycle["a"] = cycle
    cycle["b"] = cycle
    with pytest.raises(InvalidMessage, match=r"^metadata:"):
        check_metadata(cycle)


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"a": "\x00"}, "string at ['a']"),
        ({"a": [1, {"b\x00": 2}]}, "key at ['a'][1]['b\\x00']"),
        ({"a": ["\udcff"]}, "string at ['a'][0]"),
    ],
)
def test_metadata_jsonb_cannot_hold_is_refused_saying_where(metadata: object, where: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_metadata(metadata)
    assert refused.value.field == "metadata"
    assert refused.value.problem.endswith(where)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 200_000])
@pytest.mark.slow
def test_a_payload_nested_too_deep_is_refused_before_filters_walk_it(depth: int) -> None:
    with pytest.raises(InvalidMessage, match=f"deeper than {MAX_JSON_DEPTH}") as refused:
        Outbox().publish(NO_TX, "order.created", deep(depth))
    assert refused.value.field == "payload"


def test_a_payload_with_more_values_than_its_body_could_hold_is_refused() -> None:
    with pytest.raises(InvalidMessage, match=r"^payload: holds more than"):
        Outbox(max_body_bytes=100).publish(NO_TX, "order.created", [[0] * 30, [0] * 30])
