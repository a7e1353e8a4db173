"""The management API's pure parts: tokens, cursors, fingerprints, problem
details, the request models, and the OpenAPI document built from the route
table."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from openapi_spec_validator import validate
from pydantic import ValidationError

from dispatchers.api import cursors
from dispatchers.api.fingerprints import fingerprint
from dispatchers.api.openapi import document
from dispatchers.api.problems import Problem, from_validation
from dispatchers.api.requests import DeadSelection, EndpointCreate, EndpointUpdate, ReplayRequest
from dispatchers.api.routes import ROUTES, served
from dispatchers.api.tokens import bearer, is_token, new_token, shown_prefix, token_digest


def test_a_token_is_the_prefix_and_256_random_bits_and_only_its_sha256_is_kept() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert token.startswith("obx_") and len(token) == 47 and is_token(token)
        assert token_digest(token) == hashlib.sha256(token.encode()).digest()
        assert shown_prefix(token) == token[:8]
    assert not is_token("obx_short") and not is_token("xyz_" + new_token()[4:])
    assert not is_token(new_token() + "\n")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer obx_abc", "obx_abc"),
        ("bearer  obx_abc ", "obx_abc"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer ", None),
        (None, None),
    ],
)
def test_the_bearer_token_is_read_from_the_authorization_header(
    header: str | None, token: str | None
) -> None:
    assert bearer(header) == token


KEY = bytes(range(32))
"""A database's cursor key, as ``api_cursor_key`` holds one."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _signed(text: str, key: bytes = KEY) -> str:
    """``text`` as a cursor signed with ``key``, made here as the module documents it."""
    tag = hmac.new(key, text.encode(), hashlib.sha256).digest()[: cursors.TAG_BYTES]
    return f"{_b64(text.encode())}.{_b64(tag)}"


def test_a_cursor_names_its_list_and_row_and_anything_else_is_refused() -> None:
    cursor = cursors.encode("endpoints", 42, key=KEY)
    assert cursor == _signed('{"k":"endpoints","id":42}')
    assert cursors.decode("endpoints", cursor, key=KEY) == 42
    with pytest.raises(cursors.BadCursor, match="another list"):
        cursors.decode("messages", cursor, key=KEY)
    short = cursors.encode("x", 1, key=KEY)[:5]
    for bad in ("", "!!!", "e30", cursor[:-2] + "xx", "a" * 300, short):
        with pytest.raises(cursors.BadCursor):
            cursors.decode("endpoints", bad, key=KEY)
    # signed with the key, yet not what a page of endpoints ends at
    for forged in ('{"k":"endpoints","id":-1}', '{"k":"endpoints","id":true}', "[1]"):
        with pytest.raises(cursors.BadCursor, match="not a cursor this API made"):
            cursors.decode("endpoints", _signed(forged), key=KEY)
        with pytest.raises(cursors.BadCursor, match="altered"):
            cursors.decode("endpoints", _b64(forged.encode()), key=KEY)


def test_a_cursor_is_accepted_under_the_key_that_signed_it_and_no_other() -> None:
    other = bytes(reversed(range(32)))
    for kind, last, decode in (
        ("endpoints", 42, cursors.decode),
        ("tenants", "acme", cursors.decode_text),
    ):
        cursor = cursors.encode(kind, last, key=KEY)
        assert decode(kind, cursor, key=KEY) == last
        with pytest.raises(cursors.BadCursor, match="another database"):
            decode(kind, cursor, key=other)
        assert cursors.encode(kind, last, key=other) != cursor


def test_a_fingerprint_is_the_sha256_of_the_canonical_json_whatever_the_key_order() -> None:
    a = fingerprint({"b": 1, "a": [1, "é"]})
    assert a == fingerprint({"a": [1, "é"], "b": 1})
    canonical = '{"a":[1,"é"],"b":1}'
    assert a == hashlib.sha256(canonical.encode()).hexdigest()
    assert fingerprint({"a": 2}) != fingerprint({"a": 1})
    assert fingerprint(None) is None


def _problem(
    model: type[EndpointCreate | EndpointUpdate | DeadSelection | ReplayRequest], data: object
) -> Problem:
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(json.dumps(data), strict=True)
    return from_validation(caught.value, "body")


def test_a_refused_body_names_the_field_at_fault_and_quotes_no_value() -> None:
    problem = _problem(EndpointCreate, {"url": "https://x.example/", "burst": "s3cret"})
    body = problem.body("/api/v1/endpoints")
    assert body["status"] == 400 and body["field"] == "body.burst"
    assert "s3cret" not in json.dumps(body)
    assert _problem(EndpointCreate, {}).field == "body.url"
    assert _problem(EndpointCreate, {"url": "https://x/", "nope": 1}).field == "body.nope"
    listed = _problem(EndpointCreate, {"url": "https://x/", "event_types": ["ok", "a b"]})
    assert listed.field == "body.event_types[1]"


def test_null_clears_only_what_may_be_cleared() -> None:
    update = EndpointUpdate.model_validate_json('{"rate_limit": null, "filter": null}')
    assert update.model_fields_set == {"rate_limit", "filter"}
    assert _problem(EndpointUpdate, {"url": None}).field == "body.url"
    assert _problem(EndpointUpdate, {"description": None}).field == "body.description"


def test_a_dead_selection_is_never_everything_by_default_and_a_replay_is_one_kind() -> None:
    assert _problem(DeadSelection, {}).field == "body.ids"
    assert _problem(DeadSelection, {"all": True, "ids": [1]}).field == "body.all"
    assert DeadSelection.model_validate({"all": True}).all
    assert _problem(ReplayRequest, {"endpoint_id": 1}).field == "body.since"
    both = {"endpoint_id": 1, "event_key": "k", "since": "2026-01-01T00:00:00Z"}
    assert _problem(ReplayRequest, both).field == "body.event_key"
    backwards = {
        "endpoint_id": 1,
        "since": "2026-01-02T00:00:00Z",
        "until": "2026-01-01T00:00:00Z",
    }
    assert _problem(ReplayRequest, backwards).field == "body.until"
    naive = {"endpoint_id": 1, "since": "2026-01-02T00:00:00"}
    assert _problem(ReplayRequest, naive).field == "body.since"
    ancient = {"endpoint_id": 1, "since": "0001-01-01T00:00:00+14:00"}
    assert _problem(ReplayRequest, ancient).field == "body.since"


@pytest.mark.slow
def test_the_document_is_valid_openapi_and_describes_every_route_with_its_models() -> None:
    spec = document(ROUTES)
    validate(spec)
    assert spec["openapi"] == "3.1.0" and spec["servers"] == [{"url": "/api/v1"}]
    operations = {
        (method.upper(), path): op
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    }
    assert set(operations) == {(r.method, r.path) for r in ROUTES}
    schemas = spec["components"]["schemas"]
    for route in ROUTES:
        op = operations[(route.method, route.path)]
        answer = op["responses"][str(route.status)]["content"]["application/json"]["schema"]
        assert answer == {"$ref": f"#/components/schemas/{route.response.__name__}"}
        problem = op["responses"]["4XX"]["content"]["application/problem+json"]["schema"]
        assert problem == {"$ref": "#/components/schemas/ProblemOut"}
        if route.body_model is not None:
            name = route.body_model.__name__
            assert (
                schemas[name]
                == route.body_model.model_json_schema(ref_template="#/components/schemas/{model}")
                | schemas[name]
            )  # the model's own schema, tidied of nulls it does not admit
        names = {p["name"] for p in op["parameters"]}
        expected = set()
        for model in (route.path_model, route.query_model):
            if model is not None:
                expected |= set(model.model_fields)
        assert names == expected, route.path
    limit = next(p for p in operations[("GET", "/endpoints")]["parameters"] if p["name"] == "limit")
    assert limit["schema"] == {"default": 50, "maximum": 200, "minimum": 1, "type": "integer"}


def test_read_only_serves_and_documents_the_get_routes_alone() -> None:
    routes = served(read_only=True)
    assert routes and all(r.method == "GET" for r in routes)
    assert {r.path for r in routes if r.writes} == set()
    assert len(served(read_only=False)) == len(ROUTES)
