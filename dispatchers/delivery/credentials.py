"""An endpoint's credentials as the dispatcher sends them, opened once per
stored value.

:class:`OpenedAuth` opens the stored value and makes the headers each request
gets, cached by endpoint, key id and stored text (a changed value is new text,
never a stale entry). OAuth2 client credentials go on, opened, to the token
cache. Credentials that do not open hold the message back: it is never sent
without them.

Design: docs/explanation/design/endpoint-credentials.md
"""

from __future__ import annotations

import base64
from typing import NamedTuple

from dispatchers.delivery.auth import ClientCredentials
from outbox.internal import parse_auth
from outbox.sealing import ENDPOINT_AUTH, Keyring, SealBroken, Sealed, SecretKeyMissing, open_secret

__all__ = ["MAX_OPENED", "EndpointAuth", "OpenedAuth", "endpoint_auth"]

MAX_OPENED = 10_000
"""Endpoints' credentials kept opened at most; past it the cache starts again."""


class EndpointAuth(NamedTuple):
    """What an endpoint's deliveries carry of its credentials."""

    headers: dict[str, str]
    """The static headers, and ``Authorization`` for basic or bearer (shared by
    every job of the endpoint: read, never changed)."""
    oauth2: ClientCredentials | None
    """The OAuth2 client whose token goes in ``Authorization`` (None: none)."""


NO_AUTH = EndpointAuth({}, None)


def endpoint_auth(text: str) -> EndpointAuth:
    """The headers and OAuth2 client of an opened stored value."""
    auth = parse_auth(text)
    headers = dict(auth.headers)
    if auth.basic is not None:
        pair = f"{auth.basic[0]}:{auth.basic[1]}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    elif auth.bearer is not None:
        headers["Authorization"] = "Bearer " + auth.bearer
    o = auth.oauth2
    client = (
        None
        if o is None
        else ClientCredentials(o.token_url, o.client_id, o.client_secret, o.scope, o.audience)
    )
    return EndpointAuth(headers, client)


class OpenedAuth:
    """Opens the stored credentials of claimed messages' endpoints with
    ``keyring`` (None: no key is configured, so only plain text opens), each
    stored value once."""

    def __init__(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        self._opened: dict[tuple[int, str | None, str], EndpointAuth] = {}
        self.opened = 0
        """Stored values opened so far."""

    def open(
        self, endpoint_id: int | None, stored: str | None, key_id: str | None
    ) -> tuple[EndpointAuth, str | None]:
        """The endpoint's credentials, ready to send, and None; or none and why
        they are unavailable (naming the key at fault)."""
        if endpoint_id is None or stored is None:
            return NO_AUTH, None
        entry = (endpoint_id, key_id, stored)
        known = self._opened.get(entry)
        if known is not None:
            return known, None
        try:
            text = open_secret(
                self._keyring, Sealed(stored, key_id), endpoint_id=endpoint_id, kind=ENDPOINT_AUTH
            )
        except SecretKeyMissing as exc:
            return NO_AUTH, (
                f"the credentials of endpoint {endpoint_id} are sealed under key {exc.key_id}, "
                "which is not configured (set OUTBOX_SECRETS_KEY or --secrets-key-file to a "
                "key list that holds it)"
            )
        except SealBroken as exc:
            return NO_AUTH, (
                f"the credentials of endpoint {endpoint_id} do not open under key "
                f"{exc.key_id} (altered, or copied from another endpoint)"
            )
        try:
            opened = endpoint_auth(text)
        except (ValueError, KeyError, TypeError):  # stored by hand, past the checks
            return NO_AUTH, f"the credentials of endpoint {endpoint_id} are not readable"
        self.opened += 1
        if len(self._opened) >= MAX_OPENED:
            self._opened.clear()
        self._opened[entry] = opened
        return opened, None
