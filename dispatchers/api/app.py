"""The API as an aiohttp application: the routes of the table, each request
authenticated and validated before its handler runs, every refusal answered as
problem details.

:func:`build_api` makes the application the dashboard mounts under
:data:`~dispatchers.api.calls.PREFIX` (served alone by ``outbox ui --api-only``);
:func:`problems`, the middleware that answers whatever goes wrong under that
prefix (the router's 404 and 405 included), is installed on the application that
mounts it. A request is handled in this order: its bearer token (401 without a
valid one, 403 for a scope or tenant that may not use the route), its path,
query and body (400 naming the field; 415 for a body that is not JSON, 413 past
:data:`~dispatchers.api.calls.MAX_BODY`), then the handler. While the database
cannot be reached, a request that needs it is answered 503 at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from aiohttp import web
from pydantic import ValidationError

from dispatchers.api import routes
from dispatchers.api.bases import Input
from dispatchers.api.calls import API, MAX_BODY, PREFIX, Api, Call, Route
from dispatchers.api.openapi import document
from dispatchers.api.problems import Problem, from_validation, invalid
from dispatchers.api.store import find_token
from dispatchers.api.tokens import Principal, bearer, is_token, token_digest
from dispatchers.store.sqlstates import is_unreachable
from outbox.errors import InvalidArgument
from outbox.internal import check_text
from outbox.sealing import SealBroken, SecretKeyMissing

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

JSON = "application/json"

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="outbox"'}

RETRY_AFTER = 5
"""Seconds a client is told to wait (``Retry-After``) while the database is unreachable."""


def is_api_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Under the API's prefix, every refusal and failure as problem details."""
    if not is_api_path(request.path):
        return await handler(request)
    try:
        return await handler(request)
    except Problem as problem:
        return problem.response(request.path)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
        detail = "no such route" if exc.status == 404 else exc.reason
        return Problem(exc.status, detail, headers=headers).response(request.path)
    except InvalidArgument as exc:  # a handler that did not name the field's place
        return invalid(exc.field, exc.problem).response(request.path)
    except SecretKeyMissing as exc:
        detail = (
            f"a signing secret of this endpoint is sealed under key {exc.key_id}, which "
            "this server was not given (--secrets-key-file or OUTBOX_SECRETS_KEY)"
        )
        return Problem(409, detail).response(request.path)
    except SealBroken as exc:
        detail = (
            f"a signing secret of this endpoint does not open under key {exc.key_id}: it "
            "was altered or copied from another endpoint; rotate it"
        )
        return Problem(409, detail).response(request.path)
    except psycopg.errors.DataError as exc:
        _api_of(request).log.event("api_bad_value", path=request.path, sqlstate=exc.sqlstate)
        return Problem(400, "a value of this request is one the database cannot take").response(
            request.path
        )
    except psycopg.Error as exc:
        if not is_unreachable(exc):
            raise
        detail = "the database is unreachable; try again later"
        headers = {"Retry-After": str(RETRY_AFTER)}
        return Problem(503, detail, headers=headers).response(request.path)


def _api_of(request: web.Request) -> Api:
    """The API that served ``request``. :func:`problems` runs on the application
    that mounts the API's, which is ``request.app`` there and holds no API."""
    for app in reversed(request.match_info.apps):
        if API in app:
            return app[API]
    raise LookupError(f"{request.path} was not served by the API's application")


def build_api(api: Api) -> web.Application:
    """The API's application: every route of the table (the writing ones only
    unless ``api.read_only``), and its OpenAPI document."""
    app = web.Application()
    app[API] = api
    served = routes.served(read_only=api.read_only)
    spec = json.dumps(document(served))

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(text=spec, content_type=JSON)

    app.router.add_get("/openapi.json", openapi)
    for route in served:
        app.router.add_route(route.method, route.pattern or route.path, _serve(route))
    # after the routes served, which a GET there meets first
    for pattern, allowed in routes.refused(read_only=api.read_only).items():
        app.router.add_route("*", pattern, _refuse(allowed))
    return app


def _refuse(allowed: tuple[str, ...]) -> Handler:
    """A read-only server's answer to a change: 405 naming the methods served
    (an empty ``Allow``: none, RFC 9110)."""

    async def refuse(request: web.Request) -> web.StreamResponse:
        detail = "this server is read-only (--read-only): it serves no change"
        raise Problem(405, detail, headers={"Allow": ", ".join(allowed)})

    return refuse


def _serve(route: Route) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        api = request.app[API]
        who = await _authenticate(request, api, route)
        parts: dict[str, Input | None] = {
            "path": _validated(route.path_model, dict(request.match_info), "path"),
            "query": _validated(route.query_model, _query(request), "query"),
            "body": await _body(request, route, api),
        }
        answer = await route.handler(Call(request, api, who, parts))
        return web.Response(status=route.status, text=answer.model_dump_json(), content_type=JSON)

    handle.__name__ = route.operation_id
    return handle


async def _authenticate(request: web.Request, api: Api, route: Route) -> Principal:
    token = bearer(request.headers.get("Authorization"))
    if token is None:
        raise Problem(401, "give a token: Authorization: Bearer obx_...", headers=_CHALLENGE)
    if not is_token(token):
        raise Problem(401, "the bearer token is not an API token", headers=_CHALLENGE)
    digest = token_digest(token)
    who = await api.store.write(lambda conn: find_token(conn, api.schema, digest))
    if who is None:
        raise Problem(401, "the bearer token is unknown or revoked", headers=_CHALLENGE)
    if route.writes and not who.can_write:
        raise Problem(403, "this route needs a token with the write scope")
    if route.operator_only and not who.operator:
        raise Problem(403, "this route is the operator's: a tenant's token cannot use it")
    return who


def _validated(model: type[Input] | None, data: dict[str, Any], location: str) -> Input | None:
    if model is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, location) from None


def _query(request: web.Request) -> dict[str, str]:
    """The query string's parameters, each given once, each text PostgreSQL can take."""
    query: dict[str, str] = {}
    for name, value in request.query.items():
        if name in query:
            raise invalid(f"query.{name}", "is given more than once")
        query[name] = _text(value, f"query.{name}")
    return query


def _text(value: str, field: str) -> str:
    """``value``, unless PostgreSQL cannot take it as text (a NUL character): a 400
    naming ``field``, before a statement is sent with it."""
    try:
        return check_text(value, field, error=InvalidArgument)
    except InvalidArgument as exc:
        raise invalid(exc.field, exc.problem) from None


async def _body(request: web.Request, route: Route, api: Api) -> Input | None:
    """The route's body, validated (strictly: JSON types as they are); an empty
    body is ``{}``. A route without a body model ignores any body."""
    model = route.body_model
    if model is None:
        return None
    raw = await _read(request, api.body_timeout)
    if raw.strip():
        if request.content_type != JSON:
            raise Problem(415, f"the body must be {JSON}, not {request.content_type}")
    else:
        raw = b"{}"
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise from_validation(exc, "body") from None


async def _read(request: web.Request, deadline: float) -> bytes:
    """The body, at most :data:`MAX_BODY` bytes (413 past it), within
    ``deadline`` seconds (408 past it)."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise Problem(413, f"the body is larger than {MAX_BODY:,} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(deadline):
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > MAX_BODY:
                    raise Problem(413, f"the body is larger than {MAX_BODY:,} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise Problem(408, "the body did not arrive in time") from None
    return b"".join(chunks)
