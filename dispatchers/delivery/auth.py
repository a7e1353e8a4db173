"""How a dispatcher authenticates to an endpoint: its OAuth2 client credentials
(RFC 6749 §4.4), as the claim hands them over, opened. The tokens obtained with
them are :mod:`dispatchers.delivery.oauth2`'s."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClientCredentials:
    """An endpoint's OAuth2 client: where to ask for a token, as whom, for what.

    ``scope`` and ``audience`` are sent with the request when given. The secret is
    never part of the ``repr``.
    """

    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None
    audience: str | None
