"""The management API tested from its own OpenAPI document, as its users would:
``outbox ui --api-only`` serves a database with endpoints, messages and dead
letters in it; the document validates as OpenAPI 3.1; and schemathesis sends
every operation requests generated from the document, valid ones and invalid
ones, finding no 5xx, no answer that the document does not describe (status,
content type, schema), and no invalid request accepted.

The run is bounded (:data:`POSITIVE` and :data:`NEGATIVE` cases an operation,
derandomized, no shrinking), so it costs the same in CI every time.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from outbox.destinations import Destinations
from outbox.endpoints import Endpoints
from outbox.event_types import EventTypes
from outbox.tenants import Tenants
from tests.api import PREFIX, make_token
from tests.dashboard import serving
from tests.database import Db

pytestmark = pytest.mark.timeout(300)

POSITIVE = 6
"""Valid requests generated per operation (and as many again naming a row that
exists, for operations with an id in their path)."""

NEGATIVE = 4
"""Invalid requests generated per operation."""

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _seed(db: Db) -> int:
    """Rows for the generated requests to find: an endpoint, messages waiting,
    a dead one with attempts, an event type's and a destination's settings."""
    endpoint = db.endpoint(event_types=["order.created"], description="seeded")
    db.enqueue("plain-1")
    db.kill(db.enqueue("plain-2"), attempts=2)
    with db.tx() as conn:
        EventTypes().set(conn, "order.created", retry_schedule=[5, 60])
        Destinations().set(conn, "https://api.example.com", rate_limit=10)
    return endpoint


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.mark.parametrize("who", ["operator", "tenant"])
@pytest.mark.slow
def test_the_document_is_valid_and_generated_requests_meet_no_server_error_nor_an_answer_off_schema(
    database_url: str, tmp_path: Path, who: str
) -> None:
    """As the operator, and as a tenant's token (its own endpoint named in paths;
    another's rows and the operator's routes answer as the document says)."""
    db = Db(database_url)
    endpoint = _seed(db)
    tenant = None
    if who == "tenant":
        tenant = "acme"
        with db.tx() as conn:
            Tenants().add(conn, tenant, name="Acme")
            endpoint = Endpoints().add(conn, url="https://acme.example/hooks", tenant=tenant).id
    token = make_token(database_url, "write", tenant=tenant, name="schemathesis")
    argv = ["ui", "--api-only", "--port", "0", "--database-url", database_url]
    with contextlib.ExitStack() as stack, serving(argv, tmp_path / "log") as url:
        base = url.rstrip("/") + PREFIX
        document = _get(base + "/openapi.json")
        validate(document)
        schema = schemathesis.openapi.from_dict(document)
        auth = {"Authorization": f"Bearer {token}"}
        session = stack.enter_context(requests.Session())
        cases: dict[str, int] = {}
        failures: list[str] = []
        started = time.monotonic()

        def run(operation: Any, mode: GenerationMode, examples: int, **fixed: Any) -> None:
            label = f"{operation.method.upper()} {operation.path}"

            @settings(
                max_examples=examples,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(data=st.data())
            def check(data: st.DataObject) -> None:
                case = data.draw(operation.as_strategy(generation_mode=mode, **fixed))
                response = case.call(base_url=base, session=session, headers=auth, timeout=30)
                cases[mode.value] = cases.get(mode.value, 0) + 1
                negative = mode is GenerationMode.NEGATIVE
                checks = [*CHECKS, negative_data_rejection] if negative else CHECKS
                try:
                    case.validate_response(response, checks=checks, headers=auth)
                except BaseExceptionGroup as exc:  # every failure is reported, not the first
                    failures.append(f"{label} ({mode.value}): {exc}"[:2000])

            check()

        for result in schema.get_all_operations():
            operation = result.ok()
            run(operation, GenerationMode.POSITIVE, POSITIVE)
            if "{id}" in operation.path:
                run(operation, GenerationMode.POSITIVE, POSITIVE, path_parameters={"id": endpoint})
            run(operation, GenerationMode.NEGATIVE, NEGATIVE)
        elapsed = time.monotonic() - started
        log = tmp_path / "log"
        print(f"schemathesis: {cases} cases in {elapsed:.1f} s")
    assert not failures, "\n\n".join(failures)
    assert sum(cases.values()) >= 200, cases
    assert "Traceback" not in log.read_text()
