"""Opening the signing secrets a claim returns, once per sealed value.

A claim returns each webhook's secrets as stored: plain text, or sealed (see
:mod:`outbox.sealing`) with the id of the key that sealed it. Opening one is an
AES-GCM decryption; an endpoint's secrets come back with every message of it,
so :class:`OpenedSecrets` keeps what it opened, by endpoint, key id and sealed
text (its random nonce makes every sealed value unique: a rotated or resealed
secret is a new entry, never a stale one), and the claim's hot path does no AES
per message.

A secret that cannot be opened, under a key this process lacks or because it
does not open (altered, or copied from another endpoint), is never signed
without: the message's secrets are then unavailable, and the dispatcher holds
the message back (:func:`dispatchers.runtime.completions.withheld`).
"""

from __future__ import annotations

from collections.abc import Sequence

from outbox.sealing import Keyring, SealBroken, Sealed, SecretKeyMissing, open_secret

__all__ = ["MAX_OPENED", "OpenedSecrets"]

MAX_OPENED = 10_000
"""Opened secrets kept at most; past it the cache starts again (secrets of
deleted endpoints and rotated keys would otherwise stay for good)."""


class OpenedSecrets:
    """Opens the stored secrets of claimed messages with ``keyring`` (None: no key
    is configured, so only plain text opens), each sealed value once."""

    def __init__(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        self._opened: dict[tuple[int, str, str], str] = {}
        self.decrypted = 0
        """Sealed values opened so far (each an AES-GCM decryption)."""

    def open(
        self,
        endpoint_id: int | None,
        stored: Sequence[str] | None,
        key_ids: Sequence[str | None] | None,
    ) -> tuple[tuple[str, ...], str | None]:
        """The secrets of one claimed message, ready to sign with, and None; or no
        secrets and why they are unavailable (naming the key at fault)."""
        if not stored or endpoint_id is None:
            return (), None
        if key_ids is None or not any(key_ids):  # plain text only
            return tuple(stored), None
        opened: list[str] = []
        for text, key_id in zip(stored, key_ids, strict=True):
            if key_id is None:
                opened.append(text)
                continue
            entry = (endpoint_id, key_id, text)
            secret = self._opened.get(entry)
            if secret is None:
                try:
                    secret = open_secret(
                        self._keyring, Sealed(text, key_id), endpoint_id=endpoint_id
                    )
                except (SecretKeyMissing, SealBroken) as exc:
                    return (), str(exc)
                self.decrypted += 1
                if len(self._opened) >= MAX_OPENED:
                    self._opened.clear()
                self._opened[entry] = secret
            opened.append(secret)
        return tuple(opened), None
