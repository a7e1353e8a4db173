"""An endpoint's TLS material: checked before it is written, stored (its private
key sealed), and loaded into an ``ssl.SSLContext``, the one way both the check
and the dispatcher read it.

Material that would not load, or a private key anywhere but ``client_key`` (the
one sealed column), is refused with :class:`~outbox.errors.InvalidMessage`
naming the field. Files handed to ``ssl`` are anonymous or private and gone once
loaded.

Design: docs/explanation/design/endpoint-tls.md
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from outbox.errors import InvalidArgument, InvalidMessage
from outbox.sealing import CLIENT_KEY, Keyring, Sealed, seal_secret

MAX_PEM = 512 * 1024
"""The longest PEM text an endpoint stores in one field (a bundle of a few
hundred certificates)."""

_PRIVATE_KEY = "PRIVATE KEY-----"
_ENCRYPTED = ("ENCRYPTED", "Proc-Type: 4,ENCRYPTED")


def _pem(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidMessage(field, "must be PEM text")
    if len(value) > MAX_PEM:
        raise InvalidMessage(field, f"must be at most {MAX_PEM // 1024} KiB of PEM text")
    return value


def _without_key(value: str, field: str) -> str:
    if _PRIVATE_KEY in value:
        raise InvalidMessage(
            field, "holds a private key: give the key alone as client_key, which is sealed at rest"
        )
    return value


def check_ca_bundle(value: object) -> str:
    """PEM text holding at least one certificate, and no private key."""
    text = _without_key(_pem(value, "ca_bundle"), "ca_bundle")
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError):
        raise InvalidMessage("ca_bundle", "holds no PEM certificate that parses") from None
    return text


def check_client_cert(cert: object, key: object) -> tuple[str, str]:
    """A PEM certificate (with its chain, if any) and the unencrypted PEM private
    key of its public key."""
    cert_text = _without_key(_pem(cert, "client_cert"), "client_cert")
    key_text = _pem(key, "client_key")
    if _PRIVATE_KEY not in key_text or any(mark in key_text for mark in _ENCRYPTED):
        raise InvalidMessage("client_key", "must be an unencrypted PEM private key")
    try:
        ssl.create_default_context(cadata=cert_text)
    except (ssl.SSLError, ValueError):
        raise InvalidMessage("client_cert", "holds no PEM certificate that parses") from None
    try:
        load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert_text, key_text)
    except ssl.SSLError:
        raise InvalidMessage(
            "client_key", "is not a PEM private key that parses and matches client_cert"
        ) from None
    return cert_text, key_text


class Tls(NamedTuple):
    """An endpoint's TLS material: its private key new (text) or as stored."""

    ca_bundle: str | None
    client_cert: str | None
    client_key: str | Sealed | None


@dataclass(frozen=True)
class TlsChange:
    """What an add or update changes of an endpoint's TLS material, checked."""

    bundle: tuple[str | None] | None  # (new value,) or None: unchanged
    pair: tuple[str | None, str | None] | None  # (certificate, key) or None: unchanged

    @classmethod
    def of(
        cls,
        *,
        ca_bundle: str | None = None,
        clear_ca_bundle: bool = False,
        client_cert: str | None = None,
        client_key: str | None = None,
        clear_client_cert: bool = False,
    ) -> TlsChange | None:
        """The change the arguments ask for (None: none); raises
        :class:`~outbox.errors.InvalidArgument` naming the argument at fault."""
        if ca_bundle is not None and clear_ca_bundle:
            raise InvalidArgument("clear_ca_bundle", "cannot be given with ca_bundle")
        if (client_cert is None) != (client_key is None):
            missing = "client_key" if client_key is None else "client_cert"
            raise InvalidMessage(missing, "must be given with client_cert and client_key both")
        if client_cert is not None and clear_client_cert:
            raise InvalidArgument("clear_client_cert", "cannot be given with client_cert")
        bundle: tuple[str | None] | None = (None,) if clear_ca_bundle else None
        if ca_bundle is not None:
            bundle = (check_ca_bundle(ca_bundle),)
        pair: tuple[str | None, str | None] | None = (None, None) if clear_client_cert else None
        if client_cert is not None:
            pair = check_client_cert(client_cert, client_key)
        if bundle is None and pair is None:
            return None
        return cls(bundle, pair)

    def applied_to(self, current: Tls) -> Tls:
        """``current`` with this change made."""
        ca_bundle = current.ca_bundle if self.bundle is None else self.bundle[0]
        if self.pair is None:
            return Tls(ca_bundle, current.client_cert, current.client_key)
        return Tls(ca_bundle, *self.pair)


def stored_tls(keyring: Keyring | None, tls: Tls, endpoint_id: int) -> dict[str, Any]:
    """The parameters of ``endpoint_tls_update`` that store ``tls`` for
    ``endpoint_id``: a new private key sealed when there is a keyring, one as
    stored kept as it is."""
    key: Sealed | None = None
    if isinstance(tls.client_key, Sealed):
        key = tls.client_key
    elif tls.client_key is not None:
        key = seal_secret(keyring, tls.client_key, endpoint_id=endpoint_id, kind=CLIENT_KEY)
    return {
        "id": endpoint_id,
        "ca_bundle": tls.ca_bundle,
        "client_cert": tls.client_cert,
        "client_key": None if key is None else key.text,
        "client_key_id": None if key is None else key.key_id,
    }


def pem_digest(pem: str | None) -> str | None:
    """What names a PEM text where it is listed: its SHA-256, in hex."""
    return None if pem is None else hashlib.sha256(pem.encode()).hexdigest()


def load_client_cert(context: ssl.SSLContext, cert: str, key: str) -> None:
    """Load ``cert`` and ``key`` (PEM) into ``context`` as its client certificate.

    Raises ``ssl.SSLError`` when they do not parse or do not match; an encrypted
    key is refused rather than asked a password for.
    """
    with _pem_file(cert) as cert_path, _pem_file(key) as key_path:
        context.load_cert_chain(cert_path, key_path, password=_no_password)


def _no_password() -> bytes:
    raise ssl.SSLError("the private key is encrypted")


@contextmanager
def _pem_file(text: str) -> Iterator[str]:
    """A path that reads as ``text`` until the block ends, and is then gone."""
    data = text.encode()
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("outbox-pem", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="outbox-pem-") as directory:  # mode 0700
        path = os.path.join(directory, "pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield path
