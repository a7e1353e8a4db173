"""What a route of the API is, and what its handler is given.

A :class:`Route` names its method and path, the models of its path, query and
body and of its answer, its scope (GET routes read, the others write) and
whether it is the operator's alone. :mod:`~dispatchers.api.app` serves each
route by validating the request with those models before calling the handler,
and :mod:`~dispatchers.api.openapi` describes it with the same models: a route
table, not two descriptions of one API.

A handler gets a :class:`Call`: the request's validated parts, who made it
(:class:`~dispatchers.api.tokens.Principal`), the means to run work on the
database (:meth:`Call.read`, :meth:`Call.write`), and the key its page cursors
are signed with (:meth:`Call.cursor_key`: the database's, read once by the
:class:`Api`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aiohttp import web

from dispatchers.api.bases import Input, Output
from dispatchers.api.problems import Problem, invalid
from dispatchers.api.store import Conn, Store, cursor_key
from dispatchers.api.tokens import Principal
from dispatchers.runtime.log import EventLog
from outbox.endpoints import Endpoints
from outbox.errors import InvalidArgument
from outbox.sealing import Keyring

T = TypeVar("T")
M = TypeVar("M", bound=Input)

PREFIX = "/api/v1"
"""Where the API is served: every route's path is under it."""

MAX_BODY = 256 * 1024
"""The most a request's body may hold."""


@dataclass
class _Read:
    """A value read from the database once, then kept."""

    value: bytes | None = None


@dataclass(frozen=True)
class Api:
    """What the API's handlers share: the database, the log, the keys that open
    sealed signing secrets, and whether changes are served at all."""

    store: Store
    log: EventLog
    keyring: Keyring | None = None
    read_only: bool = False
    body_timeout: float = 10.0
    _cursor_key: _Read = field(default_factory=_Read, init=False, repr=False, compare=False)

    @property
    def schema(self) -> str:
        return self.store.schema

    async def cursor_key(self) -> bytes:
        """The database's key of page cursors, read the first time it is needed
        (two first reads at once read the same key)."""
        if self._cursor_key.value is None:
            self._cursor_key.value = await self.store.read(
                lambda conn: cursor_key(conn, self.schema)
            )
        return self._cursor_key.value

    def endpoints(self) -> Endpoints:
        return Endpoints(schema=self.schema, keyring=self.keyring)


API = web.AppKey("api", Api)


@dataclass(frozen=True)
class Call:
    """One request, validated: its parts, who made it, and the API."""

    request: web.Request
    api: Api
    who: Principal
    parts: dict[str, Input | None]

    def _part(self, name: str, model: type[M]) -> M:
        value = self.parts.get(name)
        if not isinstance(value, model):  # a route table that names another model
            raise TypeError(f"the route's {name} is not a {model.__name__}")
        return value

    def path(self, model: type[M]) -> M:
        return self._part("path", model)

    def query(self, model: type[M]) -> M:
        return self._part("query", model)

    def body(self, model: type[M]) -> M:
        return self._part("body", model)

    @property
    def schema(self) -> str:
        return self.api.schema

    @property
    def tenant_id(self) -> int | None:
        """The tenant the token is bound to (its rows only), or None."""
        return self.who.tenant_id

    async def read(self, work: Callable[[Conn], T]) -> T:
        """Run ``work`` in a read-only transaction."""
        return await self.api.store.read(work)

    async def write(self, work: Callable[[Conn], T]) -> T:
        """Run ``work`` in a transaction that commits when it returns (with the
        audit entry it wrote) and is rolled back when it raises."""
        return await self.api.store.write(work)

    async def cursor_key(self) -> bytes:
        """The key page cursors are signed with (the database's)."""
        return await self.api.cursor_key()

    def operator_only(self, field: str) -> None:
        """Refuse a tenant's token the use of ``field`` (a filter by tenant)."""
        if not self.who.operator:
            raise Problem(403, f"{field}: a tenant's token cannot name a tenant", field=field)


Handler = Callable[[Call], Awaitable[Output]]
Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]


@dataclass(frozen=True)
class Route:
    """One operation of the API (see the module's docstring)."""

    method: Method
    path: str
    """The OpenAPI path template, under :data:`PREFIX`."""
    handler: Handler
    response: type[Output]
    summary: str
    tag: str
    status: int = 200
    path_model: type[Input] | None = None
    query_model: type[Input] | None = None
    body_model: type[Input] | None = None
    operator_only: bool = False
    """Refused to a tenant's token (403)."""
    pattern: str | None = None
    """aiohttp's path pattern, where it differs from :attr:`path`."""
    note: str = ""
    """What the document adds to the operation's description (what a tenant's
    token may not do or see there)."""

    @property
    def writes(self) -> bool:
        """Whether the route needs the ``write`` scope (every method but GET)."""
        return self.method != "GET"

    @property
    def operation_id(self) -> str:
        return self.handler.__name__

    def parts(self) -> dict[str, type[Input] | None]:
        return {"path": self.path_model, "query": self.query_model, "body": self.body_model}


@contextlib.contextmanager
def library_errors(location: str = "body", **fields: str) -> Iterator[None]:
    """A refusal of the library (:class:`~outbox.errors.InvalidArgument`, naming
    its argument) as a 400 naming the request's field: ``location.field``, or
    the name ``fields`` maps the argument to."""
    try:
        yield
    except InvalidArgument as exc:
        name = fields.get(exc.field, f"{location}.{exc.field}")
        raise invalid(name, exc.problem) from None


def changes_of(body: Input) -> dict[str, Any]:
    """The keyword arguments of a library ``update`` that a PATCH body asks for:
    each field it sets, and ``clear_<field>`` for each it sets to null."""
    changes: dict[str, Any] = {}
    for name in body.model_fields_set:
        value = getattr(body, name)
        if value is None:
            changes[f"clear_{name}"] = True
        else:
            changes[name] = value
    return changes


def not_found(what: str, key: Any) -> Problem:
    """A 404: no ``what`` of ``key`` (or none the token may see: the two are
    one answer, so that a tenant learns nothing of another's rows)."""
    return Problem(404, f"no {what} {key}")
