"""The management API accepts exactly the values its OpenAPI document allows.

The document's schemas are the judge (JSON Schema 2020-12, date-time checked
as RFC 3339): a path or query parameter whose schema is not a string's is read
as the JSON text of its value (``limit=50``, ``enabled=true``), a body's
fields as the JSON they are. Every parameter and body field of every
operation is sent the same probes (numbers with and without a fraction, in
text and not, booleans, date-times in many forms, lists and objects) beside a
field that no route knows, so that validation refuses every request before any
handler runs, naming every field at fault: a field is named exactly when its
schema refuses its probe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.api import Client, serving_api
from tests.database import Db

pytestmark = pytest.mark.timeout(180)

UNKNOWN = "not_a_field"
"""A field no route knows: its refusal keeps every probe from reaching a handler."""

_DATE_TIMES = [
    "2024-05-01T12:00:00Z",
    "2024-05-01T12:00:00.5+02:00",
    "2024-05-01T12:00:00.123456-23:59",
    "1970-01-01T00:00:00Z",
    "9998-12-31T23:59:59Z",
    "2024-05-01t12:00:00z",
    "2024-05-01T12:00Z",
    "2024-05-01 12:00:00Z",
    "2024-05-01T12:00:00+0200",
    "2024-05-01T12:00:00",
    "2024-05-01",
    "2024-05-01T12:00:00.1234567Z",
    "1969-12-31T23:59:59Z",
    "9999-01-01T00:00:00Z",
    "2024-02-30T12:00:00Z",
    "2016-12-31T23:59:60Z",
    "1700000000",
    "0.5",
]

BODY_PROBES: list[Any] = [
    1, 8, 147, 1.0, 147.0, 1.5, 0.5, 1e2, 1700000000, 10**20, -1, 0,
    True, False, "1", "147.0", "true", "a", "acme", "https://example.com/hook",
    [1], [1.0], [1.5], ["a"], ["1"], [], {}, {"a": 1},
    *_DATE_TIMES,
]  # fmt: skip
"""Values of every JSON type but null (which an optional field's model refuses
after its fields are valid, so a request refused for another field never
meets that check: null is tried in the tests of clearing)."""

TEXT_PROBES = [
    "1", "8", "147", "1.0", "147.0", "1.5", "1e2", "+1", "01", " 1", "1 ", "-1", "0",
    "true", "false", "yes", "True", "null", "NaN", "Infinity", '"1"', "[1]", "a", "acme",
    "order.created", "dead", "https://example.com/hook", *_DATE_TIMES,
]  # fmt: skip
"""The text of path and query parameters (none of them holds a '/')."""

PATH_VALUES = {"id": "1", "event_type": "order.created", "external_id": "acme"}
"""A valid value of each path parameter, where another parameter is probed."""


def _checker(document: dict[str, Any]) -> Callable[[dict[str, Any], Any], bool]:
    """Whether a value is valid under a schema of ``document`` (its references
    resolved in the document)."""
    registry: Registry[Any] = Registry().with_resource(
        "urn:api", Resource.from_contents(document, default_specification=DRAFT202012)
    )

    def valid(schema: dict[str, Any], value: Any) -> bool:
        rooted = json.loads(json.dumps(schema).replace('"#/components', '"urn:api#/components'))
        validator = Draft202012Validator(rooted, registry=registry, format_checker=FormatChecker())
        return bool(validator.is_valid(value))

    return valid


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


def _as_json(text: str) -> tuple[bool, Any]:
    """The JSON value ``text`` is, if it is JSON (RFC 8259: no NaN) with no space around."""
    if text != text.strip():
        return False, None
    try:
        return True, json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        return False, None


def _text_valid(
    valid: Callable[[dict[str, Any], Any], bool], schema: dict[str, Any], text: str
) -> bool:
    if schema.get("type") == "string":
        return valid(schema, text)
    is_json, value = _as_json(text)
    return is_json and valid(schema, value)


def _blamed(field: str, answer: Any) -> bool:
    assert answer.status in (400, 404), (field, answer.status, answer.body)
    if answer.status != 400:
        return False
    names = [e["field"] for e in answer.problem["errors"]]
    return any(n == field or n.startswith((field + "[", field + ".")) for n in names)


async def _probe_everything(api: Client, document: dict[str, Any]) -> list[str]:
    valid = _checker(document)
    schemas = document["components"]["schemas"]
    disagreements: list[str] = []

    def path_of(template: str, **given: str) -> str:
        values = {**PATH_VALUES, **given}
        for name, value in values.items():
            template = template.replace("{" + name + "}", value)
        return template

    async def judge(label: str, field: str, expected: bool, method: str, path: str,
                    **request: Any) -> None:  # fmt: skip
        answer = await api.call(method.upper(), path, **request)
        if _blamed(field, answer) == expected:
            disagreements.append(f"{label}: {field} expected {'valid' if expected else 'invalid'}")

    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            parameters = operation["parameters"]
            in_query = [p for p in parameters if p["in"] == "query"]
            body_ref = operation.get("requestBody", {}).get("content", {})
            body_ref = body_ref.get("application/json", {}).get("schema", {}).get("$ref")
            body = schemas[body_ref.rsplit("/", 1)[1]] if body_ref else None
            # the guard that refuses the request after the probed part is checked
            guard: dict[str, Any] = {}
            if in_query:
                guard["params"] = {UNKNOWN: "1"}
            elif body is not None:
                guard["json_body"] = {UNKNOWN: 1}
            for parameter in parameters:
                name, schema = parameter["name"], parameter["schema"]
                field = f"{parameter['in']}.{name}"
                for text in TEXT_PROBES:
                    if parameter["in"] == "path" and "/" in text:
                        continue  # another path: another route, or none
                    label = f"{method.upper()} {template} {name}={text!r}"
                    expected = _text_valid(valid, schema, text)
                    if parameter["in"] == "path":
                        path = path_of(template, **{name: text})
                        await judge(label, field, expected, method, path, **guard)
                    else:
                        params = {UNKNOWN: "1", name: text}
                        await judge(label, field, expected, method, path_of(template),
                                    params=params)  # fmt: skip
            if body is None or in_query:
                continue
            for name, schema in body["properties"].items():
                for value in BODY_PROBES:
                    label = f"{method.upper()} {template} body {name}={value!r}"
                    expected = valid(schema, value)
                    await judge(label, f"body.{name}", expected, method, path_of(template),
                                json_body={UNKNOWN: 1, name: value})  # fmt: skip
    return disagreements


@pytest.mark.slow
async def test_every_parameter_and_body_field_accepts_exactly_what_its_schema_allows(
    database_url: str,
) -> None:
    async with serving_api(database_url) as api:
        document = (await api.call("GET", "/openapi.json")).body
        disagreements = await _probe_everything(api, document)
    assert not disagreements, "\n".join(disagreements)


async def test_a_number_for_a_date_time_is_refused_and_an_integral_number_for_an_integer_accepted(
    database_url: str,
) -> None:
    db = Db(database_url)
    message = db.enqueue("order-1")
    db.kill(message)
    async with serving_api(database_url) as api:
        for path, params, field in [
            ("/dead", {"since": "0.5"}, "query.since"),
            ("/messages", {"created_until": "1700000000"}, "query.created_until"),
            ("/messages", {"created_from": "2024-05-01T12:00Z"}, "query.created_from"),
            ("/endpoints", {"enabled": "1"}, "query.enabled"),
            ("/endpoints", {"limit": "+5"}, "query.limit"),
        ]:
            refused = await api.call("GET", path, params=params)
            assert refused.status == 400, (params, refused.body)
            assert refused.problem["field"] == field
        for path, params in [
            ("/dead", {"since": "2023-11-14T22:13:20Z"}),
            ("/messages", {"created_until": "2023-11-14T22:13:20.5+01:00"}),
            ("/endpoints", {"limit": "5.0", "enabled": "true"}),
        ]:
            accepted = await api.call("GET", path, params=params)
            assert accepted.status == 200, (params, accepted.body)
        for budget in (147.5, "147"):
            body = {"all": True, "budget": budget}
            refused = await api.call("POST", "/dead/retry", json_body=body)
            assert refused.status == 400 and refused.problem["field"] == "body.budget"
        window = {"endpoint_id": 1, "since": 1700000000}
        refused = await api.call("POST", "/replay", json_body=window)
        assert refused.status == 400 and refused.problem["field"] == "body.since"
        retried = await api.call("POST", "/dead/retry", json_body={"all": True, "budget": 147.0})
        assert retried.status == 200 and retried.body == {"retried": 1, "missing": []}
    # killed after 3 attempts, and given 147 more
    assert db.row(message)[:3] == ("ready", 3, 150)
