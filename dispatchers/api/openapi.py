"""The OpenAPI 3.1 document of the API, assembled from the route table and the
JSON Schemas of its models (pure).

Nothing here is written by hand but the prose: each operation's parameters,
body and answers are the models' schemas, as pydantic makes them for
validation (requests) and for serialization (answers), under
``components/schemas``. Every operation answers problem details
(``application/problem+json``) for any 4xx.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from dispatchers.api.bases import Input
from dispatchers.api.calls import PREFIX, Route
from dispatchers.api.cursors import DEFAULT_LIMIT, MAX_LIMIT
from dispatchers.api.problems import MEDIA_TYPE
from dispatchers.api.responses import ProblemOut

VERSION = "1.0.0"

_REF = "#/components/schemas/{model}"

DESCRIPTION = f"""\
The management API of outbox: endpoints, event types, messages, dead letters,
replay, destination policies, tenants and status, as the `outbox` command line
manages them.

Every request carries a bearer token made by `outbox api-tokens create`. A
`read` token may use the GET routes; a `write` token every route. A token made
for a tenant sees and changes that tenant's endpoints and their messages only;
the routes marked *operator only* refuse it (403), and a row of another tenant
is answered 404, as one that does not exist. Where an operation's description
says so, a tenant's token may not give a field, or sees one as null.

Lists are pages of at most `limit` rows (default {DEFAULT_LIMIT}, at most
{MAX_LIMIT}); `next_cursor`, when not null, is passed back as `cursor` for the
next page. A cursor is opaque, signed with the database's own key
(`api_cursor_key`): it works on every process serving that database, across
restarts; one altered, of another list or made on another database is refused
as a bad `cursor` (400). Every refusal is an RFC 9457 problem details
object whose `field` names the part of the request at fault (`body.url`,
`query.limit`, `path.id`). A request is accepted as its schemas allow: a path
or query parameter whose type is not a string is read as JSON (`limit=50`,
`enabled=true`). Every change is recorded in the audit log (`GET /audit`).
"""


def document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI document of ``routes``."""
    keys: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ProblemOut, "serialization")]
    for route in routes:
        keys.append((route.response, "serialization"))
        if route.body_model is not None:
            keys.append((route.body_model, "validation"))
    refs, top = models_json_schema(keys, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        body = route.body_model
        operation: dict[str, Any] = {
            "operationId": route.operation_id,
            "summary": route.summary,
            "tags": [route.tag],
            "security": [{"bearer": []}],
            "parameters": [
                *_parameters(route.path_model, "path"),
                *_parameters(route.query_model, "query"),
            ],
            "responses": {
                str(route.status): {
                    "description": route.summary,
                    "content": {
                        "application/json": {"schema": refs[(route.response, "serialization")]}
                    },
                },
                "4XX": {
                    "description": "refused: problem details naming the field at fault",
                    "content": {MEDIA_TYPE: {"schema": refs[(ProblemOut, "serialization")]}},
                },
                "503": {
                    "description": "the database is unreachable: problem details, with "
                    "Retry-After; try again",
                    "content": {MEDIA_TYPE: {"schema": refs[(ProblemOut, "serialization")]}},
                },
            },
        }
        notes = ["Needs a token with the write scope." if route.writes else ""]
        if route.operator_only:
            notes.append("Operator only: a tenant's token is refused.")
        notes.append(route.note)
        operation["description"] = " ".join(n for n in notes if n) or "Any token."
        if body is not None:
            operation["requestBody"] = {
                "required": bool(body.model_json_schema().get("required")),
                "content": {"application/json": {"schema": refs[(body, "validation")]}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "outbox management API", "version": VERSION, "description": DESCRIPTION},
        "servers": [{"url": PREFIX}],
        "paths": paths,
        "components": {
            "schemas": _tidy(top.get("$defs", {})),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token of `outbox api-tokens create` (obx_...)",
                }
            },
        },
    }


def _parameters(model: type[Input] | None, location: str) -> list[dict[str, Any]]:
    """The parameters of ``model``'s fields, in ``location`` (``path``, ``query``)."""
    if model is None:
        return []
    schema = model.model_json_schema(ref_template=_REF)
    required = set(schema.get("required", ()))
    out = []
    for name, field_schema in schema.get("properties", {}).items():
        parameter: dict[str, Any] = {
            "name": name,
            "in": location,
            "required": location == "path" or name in required,
            "schema": _tidy(
                {k: v for k, v in field_schema.items() if k not in ("title", "description")}
            ),
        }
        if "description" in field_schema:
            parameter["description"] = field_schema["description"]
        out.append(parameter)
    return out


def _tidy(schema: Any) -> Any:
    """``schema`` without the ``"default": null`` of a field whose schema admits
    no null (an optional field that may be left out but not sent as null)."""
    if isinstance(schema, list):
        return [_tidy(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    tidy = {key: _tidy(value) for key, value in schema.items()}
    if "default" in tidy and tidy["default"] is None and not _admits_null(tidy):
        del tidy["default"]
    return tidy


def _admits_null(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(isinstance(s, dict) and _admits_null(s) for s in schema.get("anyOf", ()))
