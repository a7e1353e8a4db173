"""The credential options of ``outbox endpoints add`` and ``update``: static
headers, HTTP basic, a bearer token, OAuth2 client credentials.

Secrets are best read from files (``--basic-auth-file``, ``--bearer-token-file``,
``--oauth2-client-secret-file``: the first line, through
:func:`~dispatchers.cli._common.read_small_file`), so that they stay out of
argv, ``ps`` and shell history; ``--header`` and ``--basic-auth`` take their
value on the command line for convenience. What is read is checked by
:mod:`outbox._endpoint_auth` before anything is written, and refused naming
the option; only the names of the headers and the scheme are ever shown.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dispatchers.cli._common import UsageError, read_small_file
from outbox.endpoints import OAuth2ClientCredentials
from outbox.errors import InvalidArgument
from outbox.internal import MAX_CREDENTIAL

__all__ = [
    "AUTH_EXCLUSIVE",
    "AUTH_UPDATE_OPTIONS",
    "add_auth_options",
    "auth_arguments",
    "naming_auth_options",
]

_FIELDS = {
    "headers": "--header",
    "clear_headers": "--no-headers",
    "basic_auth": "--basic-auth",
    "clear_basic_auth": "--no-basic-auth",
    "bearer_token": "--bearer-token-file",
    "clear_bearer_token": "--no-bearer-token",
    "oauth2": "--oauth2-token-url",
    "oauth2.token_url": "--oauth2-token-url",
    "oauth2.client_id": "--oauth2-client-id",
    "oauth2.client_secret": "--oauth2-client-secret-file",
    "oauth2.scope": "--oauth2-scope",
    "oauth2.audience": "--oauth2-audience",
    "clear_oauth2": "--no-oauth2",
}
"""The option that gives each credential argument of an endpoint."""

AUTH_UPDATE_OPTIONS = {
    "--header": "headers",
    "--no-headers": "no_headers",
    "--basic-auth": "basic_auth",
    "--basic-auth-file": "basic_auth_file",
    "--no-basic-auth": "no_basic_auth",
    "--bearer-token-file": "bearer_token_file",
    "--no-bearer-token": "no_bearer_token",
    "--oauth2-token-url": "oauth2_token_url",
    "--oauth2-client-id": "oauth2_client_id",
    "--oauth2-client-secret-file": "oauth2_client_secret_file",
    "--oauth2-scope": "oauth2_scope",
    "--oauth2-audience": "oauth2_audience",
    "--no-oauth2": "no_oauth2",
}
"""Every option of ``update`` that changes a credential, with its destination."""

AUTH_EXCLUSIVE = (
    (("--header",), "--no-headers"),
    (("--basic-auth", "--basic-auth-file"), "--no-basic-auth"),
    (("--bearer-token-file",), "--no-bearer-token"),
    (("--oauth2-token-url", "--oauth2-client-id", "--oauth2-client-secret-file"), "--no-oauth2"),
)
"""Options that set a credential, and the one that removes it."""

_OAUTH2 = ("--oauth2-token-url", "--oauth2-client-id", "--oauth2-client-secret-file")
"""The OAuth2 options given together (scope and audience are optional)."""


def add_auth_options(p: argparse.ArgumentParser, *, update: bool) -> None:
    """The options of ``add`` (and, with ``update``, of ``update``, with those
    that remove a credential) that set what its deliveries carry."""
    p.add_argument(
        "--header",
        dest="headers",
        action="append",
        default=None,
        metavar="'NAME: VALUE'",
        help="a header every delivery carries, its value sealed at rest with a key "
        "configured (repeatable"
        + ("; replaces them all)" if update else ")")
        + "; not one the outbox sets (Idempotency-Key, webhook-*, traceparent, "
        "Content-Type...)",
    )
    if update:
        p.add_argument("--no-headers", action="store_true", help="remove its static headers")
    p.add_argument(
        "--basic-auth",
        metavar="USER:PASSWORD",
        help="send HTTP basic authentication (the password shows in ps and shell "
        "history: prefer --basic-auth-file); one of basic, bearer and OAuth2 at a time",
    )
    p.add_argument(
        "--basic-auth-file",
        metavar="FILE",
        help="HTTP basic authentication, USER:PASSWORD on the file's first line",
    )
    p.add_argument(
        "--bearer-token-file",
        metavar="FILE",
        help="send Authorization: Bearer with the token on the file's first line",
    )
    p.add_argument(
        "--oauth2-token-url",
        metavar="URL",
        help="fetch a bearer token from this OAuth2 token endpoint (client credentials "
        "grant); with --oauth2-client-id and --oauth2-client-secret-file",
    )
    p.add_argument("--oauth2-client-id", metavar="ID", help="the OAuth2 client's id")
    p.add_argument(
        "--oauth2-client-secret-file",
        metavar="FILE",
        help="the OAuth2 client's secret, on the file's first line",
    )
    p.add_argument("--oauth2-scope", metavar="SCOPE", help="the scope to ask the token for")
    p.add_argument("--oauth2-audience", metavar="AUDIENCE", help="the audience to ask it for")
    if update:
        # one scheme at a time: switching is removing one and giving another
        p.add_argument(
            "--no-basic-auth",
            action="store_true",
            help="stop sending basic auth (with another scheme's option: switch to it)",
        )
        p.add_argument(
            "--no-bearer-token",
            action="store_true",
            help="stop sending the bearer token (with another scheme's option: switch to it)",
        )
        p.add_argument(
            "--no-oauth2",
            action="store_true",
            help="remove the OAuth2 client (with another scheme's option: switch to it)",
        )


def auth_arguments(args: argparse.Namespace, *, update: bool) -> dict[str, Any]:
    """The keyword arguments of ``Endpoints.add`` (or ``update``) for the
    credential options given; a usage error naming the option for one that
    cannot be read or parsed."""
    chosen: dict[str, Any] = {
        "headers": None if args.headers is None else _headers(args.headers),
        "basic_auth": _basic_auth(args),
        "bearer_token": _first_line(args.bearer_token_file, "--bearer-token-file"),
        "oauth2": _oauth2(args),
    }
    if update:
        chosen |= {
            "clear_headers": args.no_headers,
            "clear_basic_auth": args.no_basic_auth,
            "clear_bearer_token": args.no_bearer_token,
            "clear_oauth2": args.no_oauth2,
        }
    return chosen


def _headers(given: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for entry in given:
        name, colon, value = entry.partition(":")
        if not colon or not name.strip():
            raise UsageError("--header: give each header as 'Name: value'")
        name = name.strip()
        if name.lower() in (n.lower() for n in headers):
            raise UsageError(f"--header: {name} is given more than once")
        headers[name] = value.strip(" \t")
    return headers


def _first_line(path: str | None, option: str) -> str | None:
    """The first line of the file ``path`` (its line ending dropped), or None."""
    if path is None:
        return None
    text = read_small_file(path, option, limit=MAX_CREDENTIAL + 2)
    line = text.split("\n", 1)[0].removesuffix("\r")
    if not line:
        raise UsageError(f"{option}: {path} holds nothing on its first line")
    return line


def _basic_auth(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.basic_auth is not None and args.basic_auth_file is not None:
        raise UsageError("give --basic-auth or --basic-auth-file, not both")
    option = "--basic-auth" if args.basic_auth is not None else "--basic-auth-file"
    text = args.basic_auth
    if text is None:
        text = _first_line(args.basic_auth_file, option)
    if text is None:
        return None
    user, colon, password = text.partition(":")
    if not colon or not user:
        raise UsageError(f"{option}: give USER:PASSWORD")
    return user, password


def _oauth2(args: argparse.Namespace) -> OAuth2ClientCredentials | None:
    given = [
        args.oauth2_token_url,
        args.oauth2_client_id,
        args.oauth2_client_secret_file,
    ]
    optional = args.oauth2_scope is not None or args.oauth2_audience is not None
    if all(value is None for value in given):
        if optional:
            raise UsageError(f"--oauth2-scope and --oauth2-audience need {', '.join(_OAUTH2)}")
        return None
    missing = [option for option, value in zip(_OAUTH2, given, strict=True) if value is None]
    if missing:
        raise UsageError(f"{', '.join(missing)}: must be given with {', '.join(_OAUTH2)}")
    secret = _first_line(args.oauth2_client_secret_file, "--oauth2-client-secret-file")
    return OAuth2ClientCredentials(
        token_url=args.oauth2_token_url,
        client_id=args.oauth2_client_id,
        client_secret=secret or "",
        scope=args.oauth2_scope,
        audience=args.oauth2_audience,
    )


@contextmanager
def naming_auth_options(args: argparse.Namespace) -> Iterator[None]:
    """A refused credential is a usage error naming the field and the option
    that gave it."""
    try:
        yield
    except InvalidArgument as exc:
        field = exc.field
        option = _FIELDS.get(field)
        if field == "basic_auth" and args.basic_auth_file is not None:
            option = "--basic-auth-file"
        if option is None and field.startswith("headers["):
            option = "--header"
        if option is None:
            raise
        raise UsageError(f"{field}: {exc.problem} ({option})") from None
