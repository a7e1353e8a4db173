"""Standard Webhooks signing and verification, checked against the reference library.

``standardwebhooks.Webhook`` is the independent verifier (and signer): our
signatures must pass it, and its signatures must pass ``outbox.receiver.verify``.
Also the receiver's ``Idempotency-Key`` helper. Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatchers.delivery.http import idempotency_header
from dispatchers.delivery.signing import generate_secret, parse_secret, sign, webhook_headers
from outbox import InvalidMessage, OutboxError
from outbox.errors import ConfigurationError
from outbox.receiver import InvalidSignature, idempotency_key, verify
from outbox.secrets import MAX_KEY_BYTES, MIN_KEY_BYTES, check_secret

OLD = "whsec_" + base64.b64encode(bytes(range(32))).decode()
NEW = "whsec_" + base64.b64encode(bytes(range(100, 124))).decode()  # 24 bytes: the minimum
OTHER = "whsec_" + base64.b64encode(b"\xff" * 64).decode()  # 64 bytes: the maximum
T0 = 1_700_000_000
BODY = b'{"type":"invoice.paid","data":{"id":42}}'

secret_keys = st.binary(min_size=MIN_KEY_BYTES, max_size=MAX_KEY_BYTES)
msg_ids = st.from_regex(r"[A-Za-z0-9_\-:.]{1,64}", fullmatch=True)
utf8_bodies = st.text(st.characters(codec="utf-8")).map(str.encode)


def whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


def headers_now(secrets: list[str], body: bytes, msg_id: str = "msg_1") -> dict[str, str]:
    return webhook_headers(secrets, msg_id=msg_id, timestamp=int(time.time()), body=body)


# --- our signatures pass the reference verifier ---------------------------------------


@pytest.mark.parametrize("secret", [OLD, NEW, OTHER])
@pytest.mark.parametrize("body", [BODY, b"", "héllo wörld ✓".encode(), b"a.b.c"])
def test_reference_library_accepts_our_signature(secret: str, body: bytes) -> None:
    headers = headers_now([secret], body)
    Webhook(secret).verify(body, headers, json_parse=False)


@given(key=secret_keys, msg_id=msg_ids, body=utf8_bodies)
def test_reference_library_accepts_our_signature_for_any_input(
    key: bytes, msg_id: str, body: bytes
) -> None:
    secret = whsec(key)
    Webhook(secret).verify(body, headers_now([secret], body, msg_id), json_parse=False)


def test_reference_library_rejects_our_signature_under_another_secret() -> None:
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(BODY, headers_now([OLD], BODY), json_parse=False)


@pytest.mark.parametrize("receiver_holds", [OLD, NEW])
def test_rotation_signature_passes_a_receiver_holding_either_secret(receiver_holds: str) -> None:
    headers = headers_now([NEW, OLD], BODY)
    Webhook(receiver_holds).verify(BODY, headers, json_parse=False)
    verify(receiver_holds, headers, BODY)


def test_sign_gives_one_entry_per_secret_in_order() -> None:
    both = sign([NEW, OLD, OTHER], msg_id="m", timestamp=T0, body=BODY).split(" ")
    singles = [sign([s], msg_id="m", timestamp=T0, body=BODY) for s in (NEW, OLD, OTHER)]
    assert both == singles
    assert all(entry.startswith("v1,") for entry in both)
    assert len(set(both)) == 3


def test_signature_covers_id_timestamp_and_body_as_documented() -> None:
    content = b"msg_2KWPBgLlAfxdpx2AI54pPJ85f4W.1674087231." + BODY
    expected = hmac.new(parse_secret(OLD), content, hashlib.sha256).digest()
    got = sign([OLD], msg_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", timestamp=1674087231, body=BODY)
    assert got == "v1," + base64.b64encode(expected).decode()


def test_webhook_headers_are_the_three_standard_headers() -> None:
    headers = webhook_headers([OLD], msg_id="msg_9", timestamp=T0, body=BODY)
    assert headers == {
        "webhook-id": "msg_9",
        "webhook-timestamp": str(T0),
        "webhook-signature": sign([OLD], msg_id="msg_9", timestamp=T0, body=BODY),
    }


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"secrets": []}, "secrets"),
        ({"secrets": OLD}, "secrets"),
        ({"secrets": ["whsec_short"]}, "secrets"),
        ({"secrets": [OLD, "nope"]}, "secrets"),
        ({"msg_id": ""}, "msg_id"),
        ({"msg_id": "a\nb"}, "msg_id"),
        ({"timestamp": -1}, "timestamp"),
        ({"timestamp": 1.5}, "timestamp"),
        ({"timestamp": True}, "timestamp"),
        ({"body": "text"}, "body"),
    ],
)
def test_sign_rejects_bad_arguments_naming_them(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"secrets": [OLD], "msg_id": "m", "timestamp": T0, "body": BODY}
    args.update(kwargs)
    with pytest.raises(InvalidMessage) as info:
        sign(args.pop("secrets"), **args)  # type: ignore[arg-type]
    assert info.value.field == field


# --- the reference library's signatures pass our verifier -------------------------------


@given(key=secret_keys, msg_id=msg_ids, body=st.text(st.characters(codec="utf-8")))
def test_our_verify_accepts_reference_library_signatures(
    key: bytes, msg_id: str, body: str
) -> None:
    secret = whsec(key)
    at = datetime.fromtimestamp(T0, tz=UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(T0),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body),
    }
    verify(secret, headers, body.encode(), now=T0)
    with pytest.raises(InvalidSignature):
        verify(whsec(bytes(b ^ 1 for b in key)), headers, body.encode(), now=T0)


# --- our own verifier --------------------------------------------------------------------


def signed(secrets: list[str], body: bytes = BODY, at: int = T0) -> dict[str, str]:
    return webhook_headers(secrets, msg_id="msg_1", timestamp=at, body=body)


@given(keys=st.lists(secret_keys, min_size=1, max_size=3), msg_id=msg_ids, body=st.binary())
def test_verify_accepts_what_sign_produces(keys: list[bytes], msg_id: str, body: bytes) -> None:
    secrets = [whsec(k) for k in keys]
    headers = webhook_headers(secrets, msg_id=msg_id, timestamp=T0, body=body)
    for secret in secrets:
        verify(secret, headers, body, now=T0)
    verify(secrets, headers, body, now=T0)


def test_verify_accepts_any_of_several_receiver_secrets() -> None:
    verify([OTHER, OLD], signed([NEW, OLD]), BODY, now=T0)
    verify((NEW,), signed([NEW, OLD]), BODY, now=T0)


def test_verify_rejects_tampered_body() -> None:
    with pytest.raises(InvalidSignature, match="no signature matches"):
        verify(OLD, signed([OLD]), BODY + b" ", now=T0)


@pytest.mark.parametrize("header", ["webhook-id", "webhook-timestamp"])
def test_verify_rejects_tampered_signed_headers(header: str) -> None:
    headers = signed([OLD])
    headers[header] = "msg_2" if header == "webhook-id" else str(T0 + 1)
    with pytest.raises(InvalidSignature, match="no signature matches"):
        verify(OLD, headers, BODY, now=T0)


def test_verify_rejects_wrong_secret() -> None:
    with pytest.raises(InvalidSignature, match="no signature matches"):
        verify([NEW, OTHER], signed([OLD]), BODY, now=T0)


@pytest.mark.parametrize(
    ("now", "reason"),
    [(T0 + 301, "too old"), (T0 - 301, "too far in the future")],
)
def test_verify_rejects_timestamps_outside_the_tolerance(now: float, reason: str) -> None:
    with pytest.raises(InvalidSignature, match=reason):
        verify(OLD, signed([OLD]), BODY, now=now)


@pytest.mark.parametrize("now", [T0 - 300, T0 + 300, T0 + 299.9])
def test_verify_accepts_timestamps_at_the_tolerance_edge(now: float) -> None:
    verify(OLD, signed([OLD]), BODY, now=now)


def test_verify_tolerance_is_configurable() -> None:
    verify(OLD, signed([OLD]), BODY, now=T0 + 3600, tolerance=3600)
    with pytest.raises(InvalidSignature, match="too old"):
        verify(OLD, signed([OLD]), BODY, now=T0 + 11, tolerance=10)
    with pytest.raises(ConfigurationError):
        verify(OLD, signed([OLD]), BODY, now=T0, tolerance=-1)


def test_verify_uses_the_current_time_by_default() -> None:
    verify(OLD, signed([OLD], at=int(time.time())), BODY)
    with pytest.raises(InvalidSignature, match="too old"):
        verify(OLD, signed([OLD], at=int(time.time()) - 600), BODY)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_verify_rejects_missing_headers(missing: str) -> None:
    headers = signed([OLD])
    del headers[missing]
    with pytest.raises(InvalidSignature, match=f"missing {missing}"):
        verify(OLD, headers, BODY, now=T0)
    headers[missing] = ""
    with pytest.raises(InvalidSignature, match=f"missing {missing}"):
        verify(OLD, headers, BODY, now=T0)


@pytest.mark.parametrize(
    "stamp", ["1700000000.5", "abc", "+1700000000", " 1700000000", "-5", "1_7", "\u0661\u0667"]
)
def test_verify_rejects_non_integer_timestamps(stamp: str) -> None:
    headers = signed([OLD])
    headers["webhook-timestamp"] = stamp
    with pytest.raises(InvalidSignature, match="not an integer"):
        verify(OLD, headers, BODY, now=T0)


def test_verify_looks_headers_up_case_insensitively() -> None:
    headers = {name.title(): value for name, value in signed([OLD]).items()}
    assert "Webhook-Signature" in headers
    verify(OLD, headers, BODY, now=T0)
    verify(OLD, {name.upper(): value for name, value in headers.items()}, BODY, now=T0)


def test_verify_rejects_the_same_header_twice_with_different_values() -> None:
    headers = signed([OLD])
    headers["WEBHOOK-ID"] = "msg_other"
    with pytest.raises(InvalidSignature, match="conflicting webhook-id"):
        verify(OLD, headers, BODY, now=T0)


@pytest.mark.parametrize(
    "listed",
    [
        " ",
        "v1",
        "v1,",
        "v1,!!!!",
        "v1,not base64 at all",
        "garbage",
        ",,,",
        "v1,AAAA",
        "v2,{good}",
        "v1a,{good}",
        "V1,{good}",
        "v1,{good}x",
        "v1{good}",
    ],
)
def test_verify_rejects_garbage_signature_lists(listed: str) -> None:
    headers = signed([OLD])
    good = headers["webhook-signature"].removeprefix("v1,")
    headers["webhook-signature"] = listed.format(good=good)
    with pytest.raises(InvalidSignature):
        verify(OLD, headers, BODY, now=T0)


def test_verify_skips_unknown_versions_and_garbage_to_find_a_match() -> None:
    headers = signed([OLD])
    good = headers["webhook-signature"]
    headers["webhook-signature"] = f"v1a,{good[3:]} garbage v1,!!!  v2,xyz {good}"
    verify(OLD, headers, BODY, now=T0)


def test_verify_refuses_a_str_body() -> None:
    with pytest.raises(TypeError, match="raw request bytes"):
        verify(OLD, signed([OLD]), BODY.decode(), now=T0)  # type: ignore[arg-type]


@pytest.mark.parametrize("secrets", ["whsec_", "nope", [], [OLD, "whsec_!!"]])
def test_verify_rejects_a_malformed_receiver_secret_as_configuration(secrets: object) -> None:
    with pytest.raises(InvalidMessage, match="secret"):
        verify(secrets, signed([OLD]), BODY, now=T0)  # type: ignore[arg-type]


def test_invalid_signature_is_an_outbox_error() -> None:
    assert issubclass(InvalidSignature, OutboxError)
    assert not issubclass(InvalidSignature, InvalidMessage)


# --- secrets -----------------------------------------------------------------------------


def test_generate_secret_round_trips() -> None:
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(parse_secret(secret)) == 32
    assert check_secret(secret) == secret
    assert generate_secret() != secret
    Webhook(secret).verify(BODY, headers_now([secret], BODY), json_parse=False)


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        (base64.b64encode(bytes(32)).decode(), "must start with 'whsec_'"),
        ("WHSEC_" + base64.b64encode(bytes(32)).decode(), "must start with 'whsec_'"),
        ("whsec_" + "!" * 44, "not valid base64"),
        ("whsec_" + base64.urlsafe_b64encode(b"\xfb" * 32).decode(), "not valid base64"),
        ("whsec_" + base64.b64encode(bytes(32)).decode() + " ", "not valid base64"),
        ("whsec_A", "not valid base64"),
        ("whsec_", "not 0"),
        (whsec(bytes(MIN_KEY_BYTES - 1)), "not 23"),
        (whsec(bytes(MAX_KEY_BYTES + 1)), "not 65"),
        (12345, "must be a string"),
    ],
)
def test_parse_secret_errors_name_the_field(secret: object, problem: str) -> None:
    with pytest.raises(InvalidMessage, match=problem) as info:
        parse_secret(secret)
    assert info.value.field == "secret"
    assert str(info.value).startswith("secret: ")
    with pytest.raises(InvalidMessage) as named:
        parse_secret(secret, "signing_secret")
    assert named.value.field == "signing_secret"


def test_parse_secret_error_never_shows_the_secret() -> None:
    secret = whsec(b"k" * 23)
    with pytest.raises(InvalidMessage) as info:
        parse_secret(secret)
    assert secret[6:] not in str(info.value)


@pytest.mark.parametrize("size", [MIN_KEY_BYTES, 32, MAX_KEY_BYTES])
def test_parse_secret_accepts_24_to_64_bytes_padded_or_not(size: int) -> None:
    key = bytes(range(size))
    assert parse_secret(whsec(key)) == key
    assert parse_secret(whsec(key).rstrip("=")) == key


# --- Idempotency-Key ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ('"order-42"', "order-42"),
        ('"a \\"quoted\\" \\\\ key"', 'a "quoted" \\ key'),
        ('""', ""),
        ("order-42", "order-42"),
        ("  order-42 ", "order-42"),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    ],
)
def test_idempotency_key_unwraps_sf_strings_and_keeps_tokens(value: str, key: str) -> None:
    assert idempotency_key({"Idempotency-Key": value}) == key
    assert idempotency_key({"idempotency-key": value}) == key


def test_idempotency_key_round_trips_what_the_dispatcher_sends() -> None:
    for key in ["plain", 'with "quotes"', "back\\slash", "sp ace"]:
        assert idempotency_key({"IDEMPOTENCY-KEY": idempotency_header(key, "structured")}) == key
        assert idempotency_key({"Idempotency-Key": idempotency_header(key, "raw")}) == key.strip()


def test_idempotency_key_is_none_when_absent() -> None:
    assert idempotency_key({}) is None
    assert idempotency_key({"webhook-id": "msg_1"}) is None
    assert idempotency_key({"Idempotency-Key": "  "}) is None


@pytest.mark.parametrize("value", ['"open', '"bad \\n escape"', '"a"b"', '"tab\tinside"', '"é"'])
def test_idempotency_key_rejects_malformed_sf_strings(value: str) -> None:
    with pytest.raises(InvalidMessage, match="Idempotency-Key"):
        idempotency_key({"Idempotency-Key": value})
