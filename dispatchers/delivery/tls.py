"""The TLS context of each endpoint with TLS material of its own, built once.

:class:`TlsContexts` keeps each endpoint's ``ssl.SSLContext`` with the stored
values it was built from, and builds a new one when they change. Every endpoint
gets a context of its own (clients pool connections by context). A CA bundle
replaces the system's roots for that endpoint; verification and host name checks
stay on.

Design: docs/explanation/design/endpoint-tls.md
"""

from __future__ import annotations

import ssl

import httpx

from outbox.internal import load_client_cert
from outbox.sealing import (
    CLIENT_KEY,
    Keyring,
    SealBroken,
    Sealed,
    SecretKeyMissing,
    open_secret,
)

__all__ = ["TlsContexts"]

_Material = tuple[str | None, str | None, str | None, str | None]


class TlsContexts:
    """The TLS contexts of claimed messages' endpoints, each built once; client
    keys are opened with ``keyring`` (None: only plain text ones open)."""

    def __init__(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        # by endpoint, its latest material and context: a change replaces both,
        # so this holds one context per endpoint with material of its own
        self._built: dict[int, tuple[_Material, ssl.SSLContext]] = {}
        self.built = 0
        """Contexts built so far."""

    def context(
        self,
        endpoint_id: int | None,
        ca_bundle: str | None,
        client_cert: str | None,
        client_key: str | None,
        client_key_id: str | None,
    ) -> tuple[ssl.SSLContext | None, str | None]:
        """The endpoint's own context (None: it has no TLS material, the default
        serves it) and None; or no context and why its key cannot be opened (the
        message must not go without its certificate)."""
        if endpoint_id is None or (ca_bundle is None and client_cert is None):
            return None, None
        material = (ca_bundle, client_cert, client_key, client_key_id)
        known = self._built.get(endpoint_id)
        if known is not None and known[0] == material:
            return known[1], None
        try:
            context = _build(
                self._keyring, endpoint_id, ca_bundle, client_cert, client_key, client_key_id
            )
        except SecretKeyMissing as exc:
            return None, (
                f"the client key of endpoint {endpoint_id} is sealed under key {exc.key_id}, "
                "which is not configured (set OUTBOX_SECRETS_KEY or --secrets-key-file to a "
                "key list that holds it)"
            )
        except SealBroken as exc:
            return None, (
                f"the client key of endpoint {endpoint_id} does not open under key "
                f"{exc.key_id} (altered, or copied from another endpoint)"
            )
        except ssl.SSLError as exc:  # stored by hand, past the checks of outbox.endpoints
            return None, f"the TLS material of endpoint {endpoint_id} does not load: {exc}"
        self._built[endpoint_id] = material, context
        self.built += 1
        return context, None


def _build(
    keyring: Keyring | None,
    endpoint_id: int,
    ca_bundle: str | None,
    client_cert: str | None,
    client_key: str | None,
    client_key_id: str | None,
) -> ssl.SSLContext:
    if ca_bundle is not None:
        context = ssl.create_default_context(cadata=ca_bundle)
    else:  # the roots every other delivery verifies against
        context = httpx.create_ssl_context(verify=True, trust_env=False)
    if client_cert is not None and client_key is not None:
        stored = Sealed(client_key, client_key_id)
        key = open_secret(keyring, stored, endpoint_id=endpoint_id, kind=CLIENT_KEY)
        load_client_cert(context, client_cert, key)
    return context
