"""Errors as RFC 9457 problem details (``application/problem+json``).

Every refusal of the API is a :class:`Problem`: its status, a ``type`` naming
the kind of problem (a URN of this project's, the same for every instance of
the kind), a ``title`` that is the same for the kind, a ``detail`` for this
instance, and, where a field of the request is at fault, ``field`` naming it
(``body.url``, ``query.limit``, ``path.id``) with every fault in ``errors``.
Nothing written: a request is checked whole before any statement runs, and one
refused later is refused in a transaction that is rolled back.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import ValidationError

MEDIA_TYPE = "application/problem+json"

_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid-request", "The request is not valid"),
    401: ("unauthenticated", "A valid bearer token is required"),
    403: ("forbidden", "The token may not do this"),
    404: ("not-found", "No such resource"),
    405: ("method-not-allowed", "The method is not allowed on this resource"),
    408: ("request-timeout", "The request did not arrive in time"),
    409: ("conflict", "The request conflicts with the resource's state"),
    413: ("body-too-large", "The request body is too large"),
    415: ("unsupported-media-type", "The request body must be JSON"),
    503: ("unavailable", "The service cannot answer now"),
}


@dataclass(frozen=True)
class FieldError:
    """One fault of a request: the field (``body.url``) and what is wrong."""

    field: str
    problem: str


@dataclass(eq=False)
class Problem(Exception):
    """A refusal: raised anywhere in a request's handling, answered as problem
    details by the API's middleware."""

    status: int
    detail: str
    field: str | None = None
    errors: Sequence[FieldError] = ()
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.detail)
        if self.field is not None and not self.errors:
            self.errors = (FieldError(self.field, self.detail),)

    def body(self, instance: str) -> dict[str, Any]:
        """The problem details object."""
        slug, title = _KINDS.get(self.status, ("error", "The request failed"))
        data: dict[str, Any] = {
            "type": f"urn:outbox:problem:{slug}",
            "title": title,
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
        }
        if self.field is not None:
            data["field"] = self.field
            data["errors"] = [{"field": e.field, "problem": e.problem} for e in self.errors]
        return data

    def response(self, instance: str) -> web.Response:
        return web.Response(
            status=self.status,
            text=json.dumps(self.body(instance)),
            content_type=MEDIA_TYPE,
            headers=self.headers,
        )


def invalid(field: str, problem: str) -> Problem:
    """A 400 naming ``field``."""
    return Problem(400, f"{field}: {problem}", field=field)


def from_validation(error: ValidationError, location: str) -> Problem:
    """A 400 of every fault pydantic found in the ``location`` part of a
    request (``body``, ``query``, ``path``), naming the first in ``field``.
    The faults quote no input value: a body may hold a secret."""
    errors = error.errors()
    # a value that is not null is reported for each member of an optional
    # field's union: "should be None" says nothing where another says why
    blamed = {tuple(_path(e["loc"])) for e in errors if e["type"] != "none_required"}
    faults = tuple(
        _fault(location, e)
        for e in errors
        if e["type"] != "none_required" or tuple(_path(e["loc"])) not in blamed
    ) or (FieldError(location, "is not valid"),)
    first = faults[0]
    return Problem(400, f"{first.field}: {first.problem}", field=first.field, errors=faults)


_NAMED = re.compile(r"^Value error, (\w+): (.*)\Z", re.DOTALL)


def _fault(location: str, error: Any) -> FieldError:
    """One fault, named by where it is. A rule of a whole model (two fields
    that exclude each other) names the field it blames in its message, as
    ``name: problem``."""
    named = _NAMED.match(str(error.get("msg", ""))) if not error["loc"] else None
    if named is not None:
        return FieldError(f"{location}.{named[1]}", named[2])
    return FieldError(_dotted(location, error["loc"]), _message(error))


_TAGS = frozenset({"int", "str", "float", "bool", "none", "list", "dict", "datetime"})


def _path(loc: Sequence[int | str]) -> list[int | str]:
    """The fields of an error's location, without the members of a union
    that pydantic names in it (``constrained-int``, ``function-after[...]``)."""
    return [
        part
        for part in loc
        if isinstance(part, int) or not (part in _TAGS or any(c in part for c in "[(-"))
    ]


def _dotted(location: str, loc: Sequence[int | str]) -> str:
    parts = [location]
    for part in _path(loc):
        parts.append(f"[{part}]" if isinstance(part, int) else str(part))
    return ".".join(parts).replace(".[", "[")


def _message(error: Any) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "is not a field of this request"
    if kind == "missing":
        return "is required"
    return str(error.get("msg", "is not valid")).removeprefix("Value error, ")
