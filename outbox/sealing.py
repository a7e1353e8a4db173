"""Signing secrets sealed at rest: AES-256-GCM under keys only the operator holds.

A sealed value is base64 of nonce, ciphertext and tag, stored with its key id (no
key id: plain text). The associated data names the endpoint and what the value
is, so it opens nowhere else and as nothing else. A :class:`Keyring`'s first key
seals, every key opens. ``cryptography`` is imported only when a keyring is made.

Design: docs/explanation/design/sealing.md
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from outbox.errors import ConfigurationError, InvalidArgument, OutboxError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "CLIENT_KEY",
    "ENDPOINT_AUTH",
    "KEY_BYTES",
    "SIGNING_SECRET",
    "Keyring",
    "SealBroken",
    "Sealed",
    "SecretKeyMissing",
    "generate_key",
    "key_id",
    "open_secret",
    "parse_keys",
    "seal_secret",
]

KEY_BYTES = 32
"""The length of a key: AES-256."""

NONCE_BYTES = 12
"""AES-GCM's nonce, random per sealed value (96 bits: at a few thousand secrets
per key, a repeated nonce is out of reach)."""

_KEY_ID_LABEL = b"outbox signing secrets key id"
_KEY_SEPARATORS = re.compile(r"[\s,]+")


class SecretKeyMissing(ConfigurationError):
    """A signing secret is sealed under a key that is not configured.

    ``key_id`` names the key; the secret cannot be read (nor used to sign) until
    it is configured again.
    """

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"a signing secret is sealed under key {key_id}, which is not configured "
            "(set OUTBOX_SECRETS_KEY or --secrets-key-file to a key list that holds it)"
        )


class SealBroken(OutboxError):
    """A sealed secret did not open under the key its row names: it was altered,
    or copied from another endpoint."""

    def __init__(self, key_id: str, endpoint_id: int) -> None:
        self.key_id = key_id
        super().__init__(
            f"a signing secret of endpoint {endpoint_id} does not open under key {key_id} "
            "(altered, or copied from another endpoint)"
        )


class Sealed(NamedTuple):
    """A secret as stored: the text of its column, and the id of the key that
    sealed it (None: plain text)."""

    text: str
    key_id: str | None


def generate_key() -> str:
    """A new random key, base64 (what ``OUTBOX_SECRETS_KEY`` holds)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def key_id(key: bytes) -> str:
    """The id of ``key``: 16 hex digits that name it and reveal nothing of it."""
    return hmac.new(key, _KEY_ID_LABEL, hashlib.sha256).hexdigest()[:16]


def parse_keys(text: str, field: str) -> list[bytes]:
    """The keys listed in ``text`` (base64, separated by commas or whitespace),
    first the one that seals; raise :class:`InvalidArgument` naming ``field``.

    The message says which entry is at fault by position, never by content.
    """
    entries = [entry for entry in _KEY_SEPARATORS.split(text) if entry]
    if not entries:
        raise InvalidArgument(field, "holds no key")
    keys: list[bytes] = []
    for n, entry in enumerate(entries, 1):
        try:
            key = base64.b64decode(entry, validate=True)
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise InvalidArgument(field, f"key {n} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise InvalidArgument(
                field, f"key {n} must be {KEY_BYTES} bytes of base64, not {len(key)}"
            )
        keys.append(key)
    return keys


SIGNING_SECRET = ""
"""What a sealed value is: a signing secret (the associated data of 0008's
values, unchanged)."""
CLIENT_KEY = "client key"
"""What a sealed value is: an endpoint's client private key, for mutual TLS."""
ENDPOINT_AUTH = "auth"
"""What a sealed value is: an endpoint's credentials (static headers, basic,
bearer or OAuth2 client credentials) as one JSON value (``outbox._endpoint_auth``)."""


def _aad(endpoint_id: int, kind: str) -> bytes:
    return f"outbox endpoint {endpoint_id}{' ' if kind else ''}{kind}".encode()


class Keyring:
    """The keys that seal and open signing secrets: ``keys[0]`` seals, each opens.

    Raises :class:`ConfigurationError` naming the ``encryption`` extra when
    ``cryptography`` is not installed, and :class:`InvalidArgument` for no keys
    or a key of the wrong length.
    """

    def __init__(self, keys: Sequence[bytes]) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise ConfigurationError(
                "sealing signing secrets needs the 'encryption' extra: "
                "pip install 'pg-outbox[encryption]'"
            ) from None
        if not keys:
            raise InvalidArgument("keys", "must hold at least one key")
        ciphers: dict[str, AESGCM] = {}
        for key in keys:
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise InvalidArgument("keys", f"each key must be {KEY_BYTES} bytes")
            ciphers.setdefault(key_id(key), AESGCM(key))
        self._ciphers = ciphers
        self.current: str = key_id(keys[0])
        """The id of the key that seals."""

    @classmethod
    def from_text(cls, text: str, field: str) -> Keyring:
        """The keyring of the keys listed in ``text`` (see :func:`parse_keys`)."""
        return cls(parse_keys(text, field))

    @property
    def ids(self) -> tuple[str, ...]:
        """The ids of every key held, the sealing one first."""
        return tuple(self._ciphers)

    def __repr__(self) -> str:  # never show the keys
        return f"Keyring(ids={list(self.ids)})"

    def missing(self, ids: Iterable[str]) -> list[str]:
        """Those of ``ids`` this keyring does not hold, sorted."""
        return sorted(set(ids) - set(self._ciphers))

    def seal(self, secret: str, *, endpoint_id: int, kind: str = SIGNING_SECRET) -> Sealed:
        """``secret`` (a value of ``kind``) sealed under the current key for
        ``endpoint_id``."""
        nonce = os.urandom(NONCE_BYTES)
        cipher = self._ciphers[self.current]
        sealed = nonce + cipher.encrypt(nonce, secret.encode(), _aad(endpoint_id, kind))
        return Sealed(base64.b64encode(sealed).decode("ascii"), self.current)

    def open(self, stored: Sealed, *, endpoint_id: int, kind: str = SIGNING_SECRET) -> str:
        """The secret ``stored`` holds for ``endpoint_id`` (plain text as it is),
        sealed as a value of ``kind``.

        Raises :class:`SecretKeyMissing` when its key is not held, and
        :class:`SealBroken` when it does not open.
        """
        if stored.key_id is None:
            return stored.text
        from cryptography.exceptions import InvalidTag

        cipher = self._ciphers.get(stored.key_id)
        if cipher is None:
            raise SecretKeyMissing(stored.key_id)
        try:
            raw = base64.b64decode(stored.text, validate=True)
            plain = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(endpoint_id, kind))
        except (binascii.Error, InvalidTag, ValueError):
            raise SealBroken(stored.key_id, endpoint_id) from None
        return plain.decode()


def open_secret(
    keyring: Keyring | None, stored: Sealed, *, endpoint_id: int, kind: str = SIGNING_SECRET
) -> str:
    """The secret ``stored`` holds: plain text as it is, a sealed one opened by
    ``keyring`` (:class:`SecretKeyMissing` without one that holds its key)."""
    if stored.key_id is None:
        return stored.text
    if keyring is None:
        raise SecretKeyMissing(stored.key_id)
    return keyring.open(stored, endpoint_id=endpoint_id, kind=kind)


def seal_secret(
    keyring: Keyring | None, secret: str, *, endpoint_id: int, kind: str = SIGNING_SECRET
) -> Sealed:
    """``secret`` as it is stored: sealed under the current key, or plain text
    without a keyring."""
    if keyring is None:
        return Sealed(secret, None)
    return keyring.seal(secret, endpoint_id=endpoint_id, kind=kind)
