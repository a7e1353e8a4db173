"""Sealing signing secrets at rest, and opening them once per value in the
dispatcher: pure, no database."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest

from dispatchers.delivery.unsealing import OpenedSecrets
from outbox.endpoints import MAX_ROTATION_OVERLAP, Endpoints
from outbox.errors import InvalidArgument
from outbox.sealing import (
    KEY_BYTES,
    Keyring,
    SealBroken,
    Sealed,
    SecretKeyMissing,
    generate_key,
    key_id,
    open_secret,
    parse_keys,
    seal_secret,
)
from outbox.secrets import SECRET_PREFIX, generate_secret, parse_secret

KEY_A = bytes(range(KEY_BYTES))
KEY_B = bytes(range(1, KEY_BYTES + 1))


def _forms(secret: str) -> list[str]:
    """The ways a secret could appear in a column: whole, its base64 with and
    without padding, its raw key in hex, the whole secret in base64."""
    encoded = secret[len(SECRET_PREFIX) :]
    return [
        secret,
        encoded,
        encoded.rstrip("="),
        parse_secret(secret).hex(),
        base64.b64encode(secret.encode()).decode(),
    ]


def test_a_sealed_secret_opens_for_its_endpoint_and_shows_none_of_it() -> None:
    ring = Keyring([KEY_A])
    secret = generate_secret()
    sealed = ring.seal(secret, endpoint_id=7)
    assert sealed.key_id == key_id(KEY_A) == ring.current
    assert not any(form in sealed.text for form in _forms(secret))
    assert ring.open(sealed, endpoint_id=7) == secret
    # a random nonce per value: the same secret never seals to the same text
    assert ring.seal(secret, endpoint_id=7).text != sealed.text


def test_an_altered_sealed_secret_does_not_open_and_the_error_names_the_key() -> None:
    ring = Keyring([KEY_A])
    sealed = ring.seal(generate_secret(), endpoint_id=7)
    raw = bytearray(base64.b64decode(sealed.text))
    raw[-1] ^= 1
    altered = Sealed(base64.b64encode(bytes(raw)).decode(), sealed.key_id)
    for broken in (altered, Sealed("not base64!", sealed.key_id), Sealed("", sealed.key_id)):
        with pytest.raises(SealBroken, match=ring.current):
            ring.open(broken, endpoint_id=7)


def test_a_sealed_secret_copied_to_another_endpoint_does_not_open() -> None:
    ring = Keyring([KEY_A])
    sealed = ring.seal(generate_secret(), endpoint_id=7)
    with pytest.raises(SealBroken, match="endpoint 8"):
        ring.open(sealed, endpoint_id=8)


def test_a_secret_under_a_key_not_held_names_that_key() -> None:
    sealed = Keyring([KEY_A]).seal(generate_secret(), endpoint_id=7)
    with pytest.raises(SecretKeyMissing, match=key_id(KEY_A)) as missing:
        Keyring([KEY_B]).open(sealed, endpoint_id=7)
    assert missing.value.key_id == key_id(KEY_A)
    with pytest.raises(SecretKeyMissing, match=key_id(KEY_A)):
        open_secret(None, sealed, endpoint_id=7)
    # a row that names another key than the one that sealed it does not open either
    with pytest.raises(SealBroken):
        Keyring([KEY_B]).open(Sealed(sealed.text, key_id(KEY_B)), endpoint_id=7)


def test_the_first_key_seals_and_every_key_opens() -> None:
    secret = generate_secret()
    under_a = Keyring([KEY_A]).seal(secret, endpoint_id=1)
    both = Keyring([KEY_B, KEY_A])
    assert both.ids == (key_id(KEY_B), key_id(KEY_A))
    assert both.open(under_a, endpoint_id=1) == secret
    assert both.seal(secret, endpoint_id=1).key_id == key_id(KEY_B)
    assert both.missing([key_id(KEY_A), "0123456789abcdef"]) == ["0123456789abcdef"]


def test_without_a_keyring_secrets_stay_plain_text() -> None:
    secret = generate_secret()
    assert seal_secret(None, secret, endpoint_id=1) == Sealed(secret, None)
    assert open_secret(None, Sealed(secret, None), endpoint_id=1) == secret
    assert Keyring([KEY_A]).open(Sealed(secret, None), endpoint_id=1) == secret


def test_a_key_id_names_a_key_and_tells_nothing_of_it() -> None:
    assert key_id(KEY_A) == key_id(bytes(KEY_A))
    assert key_id(KEY_A) != key_id(KEY_B)
    assert len(key_id(KEY_A)) == 16 and int(key_id(KEY_A), 16) >= 0
    assert key_id(KEY_A) not in KEY_A.hex()
    assert KEY_A.hex() not in repr(Keyring([KEY_A]))


def test_key_lists_parse_and_each_fault_names_the_field_and_the_entry() -> None:
    a, b = (base64.b64encode(k).decode() for k in (KEY_A, KEY_B))
    assert parse_keys(f"{a}\n{b}\n", "--secrets-key-file") == [KEY_A, KEY_B]
    assert parse_keys(f" {a}, {b} ", "OUTBOX_SECRETS_KEY") == [KEY_A, KEY_B]
    assert len(base64.b64decode(generate_key())) == KEY_BYTES
    short = base64.b64encode(KEY_A[:16]).decode()
    for text, problem in [
        ("", "holds no key"),
        ("not*base64", "key 1 is not valid base64"),
        (f"{a}\n{a[:-1]}", "key 2 is not valid base64"),
        (short, "key 1 must be 32 bytes of base64, not 16"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            parse_keys(text, "--secrets-key-file")
        assert refused.value.field == "--secrets-key-file"
        assert refused.value.problem == problem
        assert a not in str(refused.value)


def test_the_dispatcher_opens_each_sealed_value_once() -> None:
    ring = Keyring([KEY_A])
    new, old = generate_secret(), generate_secret()
    stored = [ring.seal(new, endpoint_id=3).text, old]
    opened = OpenedSecrets(ring)
    for _ in range(1000):
        assert opened.open(3, stored, [ring.current, None]) == ((new, old), None)
    assert opened.decrypted == 1
    # plain text only, and messages without an endpoint, decrypt nothing
    assert opened.open(3, [old], [None]) == ((old,), None)
    assert opened.open(None, None, None) == ((), None)
    assert opened.decrypted == 1


def test_the_dispatcher_never_opens_part_of_an_endpoints_secrets() -> None:
    sealed = Keyring([KEY_B]).seal(generate_secret(), endpoint_id=3)
    plain = generate_secret()
    secrets, unavailable = OpenedSecrets(Keyring([KEY_A])).open(
        3, [sealed.text, plain], [sealed.key_id, None]
    )
    assert secrets == ()
    assert unavailable is not None and key_id(KEY_B) in unavailable
    secrets, unavailable = OpenedSecrets(None).open(3, [sealed.text], [sealed.key_id])
    assert secrets == () and unavailable is not None and key_id(KEY_B) in unavailable


def test_a_rotation_overlap_is_bounded_in_the_library_too() -> None:
    endpoints = Endpoints()
    for overlap in (MAX_ROTATION_OVERLAP + timedelta(seconds=1), timedelta(seconds=-1)):
        with pytest.raises(InvalidArgument) as refused:
            endpoints.rotate_secret(None, 1, overlap=overlap)
        assert refused.value.field == "overlap"
    with pytest.raises(InvalidArgument) as refused:
        endpoints.rotate_secret(None, 1, overlap=3600)  # type: ignore[arg-type]
    assert refused.value.field == "overlap"
