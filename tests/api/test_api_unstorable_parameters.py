"""A parameter of the management API that PostgreSQL cannot take (a NUL
character) is refused as problem details naming it, whoever asks and however
the API is served (under the dashboard, or alone as ``outbox ui --api-only``
does), never a plain-text 500."""

from __future__ import annotations

import psycopg
import pytest

from dispatchers.api.tokens import Scope
from outbox.tenants import Tenants
from tests.api import make_token, serving_api

pytestmark = pytest.mark.timeout(90)

TOKENS: list[tuple[Scope, str | None]] = [
    ("read", None),
    ("write", None),
    ("read", "acme"),
    ("write", "acme"),
]
"""Every kind of token: each scope, the operator's and a tenant's."""


@pytest.mark.parametrize("pages", [True, False], ids=["mounted", "api-only"])
async def test_a_parameter_holding_a_nul_is_a_problem_naming_it_for_every_token(
    database_url: str, pages: bool
) -> None:
    with psycopg.connect(database_url) as conn:
        Tenants().add(conn, "acme")
    async with serving_api(database_url, pages=pages) as api:
        for scope, tenant in TOKENS:
            who = api.as_token(make_token(database_url, scope, tenant=tenant))
            for path, params, field in [
                ("/messages", {"key": "\x00"}, "query.key"),
                ("/messages", {"key": "order-\x00-1"}, "query.key"),
            ]:
                answer = await who.call("GET", path, params=params)
                assert answer.status == 400, (scope, tenant, path, answer.body)
                problem = answer.problem
                assert problem["type"] == "urn:outbox:problem:invalid-request"
                assert problem["field"] == field, problem
                assert "NUL" in problem["detail"], problem
