"""An endpoint's own credentials, checked before they are written and stored sealed.

Static headers and at most one scheme that sets ``Authorization`` (basic, bearer
or OAuth2 client credentials) are one JSON value (:class:`Auth`), sealed as one
secret of kind :data:`~outbox.sealing.ENDPOINT_AUTH`; what an operator may see is
written beside it by the same statement (:func:`stored_auth`). A header the outbox
sets itself, or ``Authorization`` beside a scheme, is refused with
:class:`~outbox.errors.InvalidMessage` naming it.

Design: docs/explanation/design/endpoint-credentials.md
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox._message import RESERVED_HEADERS, RESERVED_PREFIXES, check_headers, check_url
from outbox.errors import InvalidArgument, InvalidMessage
from outbox.sealing import ENDPOINT_AUTH, Keyring, Sealed, open_secret, seal_secret

__all__ = [
    "ENDPOINT_RESERVED_HEADERS",
    "MAX_CREDENTIAL",
    "Auth",
    "AuthChange",
    "OAuth2ClientCredentials",
    "parse_auth",
    "stored_auth",
]

ENDPOINT_RESERVED_HEADERS = RESERVED_HEADERS | {"traceparent", "tracestate"}
"""Headers an endpoint's static headers may not set: those a message may not,
and the trace context each attempt carries (:mod:`dispatchers.delivery.tracing`)."""

MAX_CREDENTIAL = 8192
"""The longest user, password, token, client id or secret, scope or audience."""

SCHEMES = ("basic_auth", "bearer_token", "oauth2")
"""The arguments that set ``Authorization``, at most one per endpoint."""

# visible ASCII: a token sent as it is in a header
_TOKEN = re.compile(r"^[\x21-\x7e]+\Z")
# no control character (C0, DEL, C1): text sent in a header or a form
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class OAuth2ClientCredentials:
    """An OAuth2 client (the client credentials grant) whose access token the
    dispatcher fetches from ``token_url`` and sends as a bearer token."""

    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None = None
    audience: str | None = None


@dataclass(frozen=True)
class Auth:
    """An endpoint's credentials: its static headers, and at most one scheme."""

    headers: dict[str, str] = field(default_factory=dict, repr=False)
    basic: tuple[str, str] | None = field(default=None, repr=False)
    bearer: str | None = field(default=None, repr=False)
    oauth2: OAuth2ClientCredentials | None = field(default=None, repr=False)

    def __repr__(self) -> str:  # names, never values
        return f"Auth(headers={sorted(self.headers)}, scheme={self.scheme})"

    @property
    def scheme(self) -> str | None:
        """``basic``, ``bearer`` or ``oauth2``: what sets ``Authorization`` (None: nothing)."""
        if self.basic is not None:
            return "basic"
        if self.bearer is not None:
            return "bearer"
        return "oauth2" if self.oauth2 is not None else None

    @property
    def empty(self) -> bool:
        return not self.headers and self.scheme is None

    def to_json(self) -> str:
        value: dict[str, Any] = {"headers": self.headers}
        if self.basic is not None:
            value["basic"] = {"username": self.basic[0], "password": self.basic[1]}
        if self.bearer is not None:
            value["bearer"] = self.bearer
        if self.oauth2 is not None:
            o = self.oauth2
            value["oauth2"] = {
                "token_url": o.token_url,
                "client_id": o.client_id,
                "client_secret": o.client_secret,
                "scope": o.scope,
                "audience": o.audience,
            }
        return json.dumps(value, separators=(",", ":"))


def parse_auth(text: str) -> Auth:
    """The credentials a stored (opened) JSON value holds."""
    value = json.loads(text)
    basic = value.get("basic")
    oauth2 = value.get("oauth2")
    return Auth(
        headers=dict(value.get("headers") or {}),
        basic=None if basic is None else (basic["username"], basic["password"]),
        bearer=value.get("bearer"),
        oauth2=None if oauth2 is None else OAuth2ClientCredentials(**oauth2),
    )


def open_auth(keyring: Keyring | None, stored: Sealed | None, endpoint_id: int) -> Auth:
    """The credentials ``stored`` holds (none when None), opened by ``keyring``."""
    if stored is None:
        return Auth()
    return parse_auth(open_secret(keyring, stored, endpoint_id=endpoint_id, kind=ENDPOINT_AUTH))


def check_static_headers(headers: object) -> dict[str, str]:
    """Headers every request to the endpoint carries: valid names and values
    (as a message's, :func:`outbox._message.check_headers`), none the outbox sets."""
    if isinstance(headers, Mapping):
        for name in headers:
            if isinstance(name, str) and (
                name.lower() in ENDPOINT_RESERVED_HEADERS
                or name.lower().startswith(RESERVED_PREFIXES)
            ):
                raise InvalidMessage(f"headers[{name}]", "is set by the outbox itself")
    return check_headers(headers)


def _text(value: object, name: str, *, token: bool = False, colon: bool = True) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(name, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidMessage(name, "must not be empty")
    if len(value) > MAX_CREDENTIAL:
        raise InvalidMessage(name, f"is longer than {MAX_CREDENTIAL} characters")
    if token and not _TOKEN.match(value):
        raise InvalidMessage(name, "must be printable ASCII without spaces")
    if _CONTROL.search(value) or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise InvalidMessage(name, "must not contain control characters")
    if not colon and ":" in value:
        raise InvalidMessage(name, "must not contain ':'")
    return value


def check_basic_auth(value: object) -> tuple[str, str]:
    """A user (no ``:``, RFC 7617) and a password."""
    if isinstance(value, str) or not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidMessage("basic_auth", "must be a (user, password) pair")
    user = _text(value[0], "basic_auth", colon=False)
    return user, _text(value[1], "basic_auth")


def check_oauth2(value: object) -> OAuth2ClientCredentials:
    """An OAuth2 client: its token URL passes the check of an endpoint's URL."""
    if not isinstance(value, OAuth2ClientCredentials):
        raise InvalidMessage("oauth2", "must be an OAuth2ClientCredentials")
    optional = {
        name: None if given is None else _text(given, f"oauth2.{name}")
        for name, given in (("scope", value.scope), ("audience", value.audience))
    }
    return OAuth2ClientCredentials(
        token_url=check_url(value.token_url, "oauth2.token_url"),
        client_id=_text(value.client_id, "oauth2.client_id"),
        client_secret=_text(value.client_secret, "oauth2.client_secret"),
        **optional,
    )


def _scheme_field(auth: Auth) -> str | None:
    return {"basic": "basic_auth", "bearer": "bearer_token", "oauth2": "oauth2", None: None}[
        auth.scheme
    ]


def _check_authorization(auth: Auth) -> Auth:
    for name in auth.headers:
        if name.lower() == "authorization" and auth.scheme is not None:
            raise InvalidMessage(f"headers[{name}]", f"is set by {_scheme_field(auth)}")
    return auth


@dataclass(frozen=True)
class AuthChange:
    """What an add or update changes of an endpoint's credentials, checked."""

    headers: dict[str, str] | None  # None: unchanged
    scheme: Auth | None  # the new scheme (headers unused); None: unchanged
    cleared: frozenset[str]  # the schemes to remove, by argument

    @classmethod
    def of(
        cls,
        *,
        headers: Mapping[str, str] | None = None,
        clear_headers: bool = False,
        basic_auth: tuple[str, str] | None = None,
        clear_basic_auth: bool = False,
        bearer_token: str | None = None,
        clear_bearer_token: bool = False,
        oauth2: OAuth2ClientCredentials | None = None,
        clear_oauth2: bool = False,
    ) -> AuthChange | None:
        """The change the arguments ask for (None: none); raises
        :class:`~outbox.errors.InvalidArgument` naming the argument at fault."""
        given = {"basic_auth": basic_auth, "bearer_token": bearer_token, "oauth2": oauth2}
        clears = {
            "headers": clear_headers,
            "basic_auth": clear_basic_auth,
            "bearer_token": clear_bearer_token,
            "oauth2": clear_oauth2,
        }
        for name, clear in clears.items():
            if clear and (headers if name == "headers" else given[name]) is not None:
                raise InvalidArgument(f"clear_{name}", f"cannot be given with {name}")
        chosen = [name for name, value in given.items() if value is not None]
        if len(chosen) > 1:
            raise InvalidMessage(
                chosen[1],
                f"cannot be given with {chosen[0]}: an endpoint has one of "
                "basic_auth, bearer_token and oauth2",
            )
        scheme = None
        if basic_auth is not None:
            scheme = Auth(basic=check_basic_auth(basic_auth))
        elif bearer_token is not None:
            scheme = Auth(bearer=_text(bearer_token, "bearer_token", token=True))
        elif oauth2 is not None:
            scheme = Auth(oauth2=check_oauth2(oauth2))
        checked = None
        if headers is not None:
            checked = check_static_headers(headers)
            if scheme is not None:
                _check_authorization(Auth(checked, scheme.basic, scheme.bearer, scheme.oauth2))
        elif clear_headers:
            checked = {}
        cleared = frozenset(name for name, clear in clears.items() if clear and name != "headers")
        if checked is None and scheme is None and not cleared:
            return None
        return cls(checked, scheme, cleared)

    def applied_to(self, current: Auth) -> Auth:
        """``current`` with this change made; a second scheme, and an
        ``Authorization`` header beside a scheme, are refused."""
        headers = current.headers if self.headers is None else self.headers
        kept = _scheme_field(current)
        if kept in self.cleared:
            kept = None
        if self.scheme is not None:
            new = _scheme_field(self.scheme)
            if kept is not None and kept != new:
                raise InvalidMessage(
                    new or "",
                    f"cannot be set while the endpoint has {kept}: clear that first "
                    f"(clear_{kept}, in the same update)",
                )
            scheme = self.scheme
        else:
            scheme = current if kept is not None else Auth()
        return _check_authorization(Auth(headers, scheme.basic, scheme.bearer, scheme.oauth2))


def stored_auth(keyring: Keyring | None, auth: Auth, endpoint_id: int) -> dict[str, Any]:
    """The parameters of ``endpoint_auth_update`` that store ``auth`` for
    ``endpoint_id``: sealed when there is a keyring, with what may be shown of it."""
    sealed = (
        None
        if auth.empty
        else seal_secret(keyring, auth.to_json(), endpoint_id=endpoint_id, kind=ENDPOINT_AUTH)
    )
    o = auth.oauth2
    return {
        "id": endpoint_id,
        "auth": None if sealed is None else sealed.text,
        "auth_key_id": None if sealed is None else sealed.key_id,
        "auth_scheme": auth.scheme,
        "auth_header_names": list(auth.headers),
        "basic_username": None if auth.basic is None else auth.basic[0],
        "oauth2_token_url": None if o is None else o.token_url,
        "oauth2_client_id": None if o is None else o.client_id,
        "oauth2_scope": None if o is None else o.scope,
        "oauth2_audience": None if o is None else o.audience,
    }
