"""A tenant's token sees and changes its tenant's rows only, on every route.

The database holds two tenants' endpoints and messages (``acme``, ``globex``)
and the operator's own (an endpoint of no tenant, a plain message). For every
route of the API, acme's token asks for globex's and the operator's rows (and
for operator-only routes, for anything): each is refused (404 for a row of
another, as for one that does not exist; 403 for what a tenant may never do)
or answered without them, and none of their rows changes. The same route asked
for acme's own rows answers, so that a route refusing everything cannot pass.

Beyond rows: acme's token may set nothing that makes its producer's publish
fail (a payload filter), nor see which dispatcher made an attempt.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from dispatchers.api.routes import ROUTES
from outbox import Outbox
from outbox.tenants import Tenants
from tests.api import Answer, Client, make_token, serving_api
from tests.database import Db

pytestmark = pytest.mark.timeout(90)


@dataclass
class World:
    """Two tenants' rows and the operator's, and a client with acme's token."""

    db: Db
    acme: Client
    a_endpoint: int
    b_endpoint: int
    o_endpoint: int
    a_message: int
    b_message: int
    a_dead: int
    b_dead: int
    plain_dead: int


async def _build(api: Client, db: Db, database_url: str) -> World:
    with db.tx() as conn:
        Tenants().add(conn, "acme")
        Tenants().add(conn, "globex")
    ids = {}
    for name, tenant in (("a", "acme"), ("b", "globex"), ("o", None)):
        body = {"url": f"https://{name}.example/hook", **({"tenant": tenant} if tenant else {})}
        answer = await api.call("POST", "/endpoints", json_body=body)
        assert answer.status == 201, answer.body
        ids[name] = answer.body["id"]
    sent = {}
    for name in ("a", "b", "a_dead", "b_dead"):
        endpoint = ids[name[0]]
        sent[name] = (await api.call("POST", f"/endpoints/{endpoint}/test")).body["message_id"]
    plain = db.enqueue("plain")
    for dead in (sent["a_dead"], sent["b_dead"], plain):
        db.kill(dead)
    acme = api.as_token(make_token(database_url, "write", tenant="acme", name="acme's"))
    return World(
        db, acme, ids["a"], ids["b"], ids["o"], sent["a"], sent["b"], sent["a_dead"],
        sent["b_dead"], plain,
    )  # fmt: skip


def _others(db: Db, w: World) -> list[tuple[Any, ...]]:
    """Every row that is not acme's, as it stands: what acme's token must not change
    (a message of acme's first endpoint stays acme's once that endpoint is deleted)."""
    return db.query(
        """
        SELECT 'endpoint', to_jsonb(e) - 'updated_at', (SELECT jsonb_agg(s.secret ORDER BY s.id)
               FROM outbox.endpoint_secrets AS s WHERE s.endpoint_id = e.id)
        FROM outbox.endpoints AS e
        WHERE e.tenant_id IS DISTINCT FROM (SELECT id FROM outbox.tenants
                                            WHERE external_id = 'acme')
        UNION ALL
        SELECT 'message', to_jsonb(m), NULL FROM outbox.messages AS m
        WHERE m.target <> 'endpoint:' || %s AND (m.endpoint_id IS NULL OR m.endpoint_id NOT IN (
            SELECT e.id FROM outbox.endpoints AS e JOIN outbox.tenants AS t
            ON t.id = e.tenant_id WHERE t.external_id = 'acme'))
        UNION ALL SELECT 'tenant', to_jsonb(t), NULL FROM outbox.tenants AS t
        UNION ALL SELECT 'event type', to_jsonb(x), NULL FROM outbox.event_types AS x
        UNION ALL SELECT 'policy', to_jsonb(p), NULL FROM outbox.destination_policies AS p
        UNION ALL SELECT 'token', to_jsonb(k) - 'last_used_at', NULL FROM outbox.api_tokens AS k
        ORDER BY 1, 2
        """,
        w.a_endpoint,
    )


Check = Callable[[World], Awaitable[None]]


def _given(w: World, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's parts, those given as functions of the world made of it."""
    return {k: v(w) if callable(v) else v for k, v in kwargs.items()}


def _refused(status: int, method: str, path: Callable[[World], str], **kwargs: Any) -> Check:
    async def check(w: World) -> None:
        answer = await w.acme.call(method, path(w), **_given(w, kwargs))
        assert answer.status == status, (method, path(w), answer.body)
        answer.problem  # noqa: B018 - asserts the answer is problem details

    return check


def _answered(
    method: str, path: Callable[[World], str], verify: Callable[[World, Answer], None], **kw: Any
) -> Check:
    async def check(w: World) -> None:
        answer = await w.acme.call(method, path(w), **_given(w, kw))
        assert 200 <= answer.status < 300, (method, path(w), answer.body)
        verify(w, answer)

    return check


def _only(expected: Callable[[World], list[int]]) -> Callable[[World, Answer], None]:
    def verify(w: World, answer: Answer) -> None:
        assert [item["id"] for item in answer.body["items"]] == expected(w)

    return verify


def _ok(w: World, answer: Answer) -> None:
    pass


def _foreign_endpoints(method: str, suffix: str = "", **kw: Any) -> list[Check]:
    return [
        _refused(404, method, lambda w: f"/endpoints/{w.b_endpoint}{suffix}", **kw),
        _refused(404, method, lambda w: f"/endpoints/{w.o_endpoint}{suffix}", **kw),
    ]


def _own_endpoint(method: str, suffix: str = "", **kw: Any) -> Check:
    return _answered(method, lambda w: f"/endpoints/{w.a_endpoint}{suffix}", _ok, **kw)


def _operator_only(method: str, path: str, **kw: Any) -> list[Check]:
    return [_refused(403, method, lambda w: path, **kw)]


SINCE = {"since": "2020-01-01T00:00:00Z"}

# operation id: the requests acme's token makes (foreign ones refused or
# answered without another's rows; its own answered)
REQUESTS: dict[str, list[Check]] = {
    "show_token": [
        _answered("GET", lambda w: "/token", lambda w, a: _is_acme(a.body["tenant"]))
    ],
    "status": _operator_only("GET", "/status"),
    "list_audit": _operator_only("GET", "/audit"),
    "list_endpoints": [
        _answered("GET", lambda w: "/endpoints", _only(lambda w: [w.a_endpoint])),
        _answered("GET", lambda w: "/endpoints", _only(lambda w: [w.a_endpoint]),
                  params={"tenant": "acme"}),
        _refused(403, "GET", lambda w: "/endpoints", params={"tenant": "globex"}),
    ],
    "create_endpoint": [
        _refused(403, "POST", lambda w: "/endpoints",
                 json_body={"url": "https://x.example/", "tenant": "globex"}),
        _answered("POST", lambda w: "/endpoints", lambda w, a: _is_acme(a.body["tenant"]),
                  json_body={"url": "https://x.example/"}),
    ],
    "show_endpoint": [*_foreign_endpoints("GET"), _own_endpoint("GET")],
    "update_endpoint": [
        *_foreign_endpoints("PATCH", json_body={"description": "taken"}),
        _own_endpoint("PATCH", json_body={"description": "mine"}),
    ],
    "delete_endpoint": [*_foreign_endpoints("DELETE"), _own_endpoint("DELETE")],
    "disable_endpoint": [
        *_foreign_endpoints("POST", "/disable"),
        _own_endpoint("POST", "/disable"),
    ],
    "enable_endpoint": [*_foreign_endpoints("POST", "/enable"), _own_endpoint("POST", "/enable")],
    "rotate_endpoint_secret": [
        *_foreign_endpoints("POST", "/rotate-secret"),
        _own_endpoint("POST", "/rotate-secret"),
    ],
    "test_endpoint": [*_foreign_endpoints("POST", "/test"), _own_endpoint("POST", "/test")],
    "list_messages": [
        _answered("GET", lambda w: "/messages", _only(lambda w: [w.a_dead, w.a_message])),
        _answered("GET", lambda w: "/messages", _only(lambda w: []),
                  params=lambda w: {"endpoint_id": str(w.b_endpoint)}),
        _answered("GET", lambda w: "/messages", _only(lambda w: []), params={"key": "plain"}),
        _refused(403, "GET", lambda w: "/messages", params={"tenant": "globex"}),
    ],
    "show_message": [
        _refused(404, "GET", lambda w: f"/messages/{w.b_message}"),
        _refused(404, "GET", lambda w: f"/messages/{w.plain_dead}"),
        _answered("GET", lambda w: f"/messages/{w.a_message}", _ok),
    ],
    "replay_one_message": [
        _refused(404, "POST", lambda w: f"/messages/{w.b_message}/replay"),
        _refused(404, "POST", lambda w: f"/messages/{w.plain_dead}/replay"),
        _answered("POST", lambda w: f"/messages/{w.a_message}/replay",
                  lambda w, a: _equal(a.body["replayed"], False)),
    ],
    "replay": [
        _refused(404, "POST", lambda w: "/replay",
                 json_body=lambda w: {"endpoint_id": w.b_endpoint, **SINCE}),
        _refused(404, "POST", lambda w: "/replay",
                 json_body=lambda w: {"endpoint_id": w.o_endpoint, **SINCE}),
        _refused(404, "POST", lambda w: "/replay",
                 json_body=lambda w: {"endpoint_id": w.b_endpoint, "event_key": "order-1"}),
        _answered("POST", lambda w: "/replay", lambda w, a: _equal(a.body["replayed"], 0),
                  json_body=lambda w: {"endpoint_id": w.a_endpoint, **SINCE}),
    ],
    "list_dead": [
        _answered("GET", lambda w: "/dead", _only(lambda w: [w.a_dead])),
        _refused(403, "GET", lambda w: "/dead", params={"tenant": "globex"}),
    ],
    "retry_dead": [
        _refused(404, "POST", lambda w: "/dead/retry",
                 json_body=lambda w: {"endpoint_id": w.b_endpoint}),
        _answered("POST", lambda w: "/dead/retry",
                  lambda w, a: _equal(a.body, {"retried": 0, "missing": [w.b_dead, w.plain_dead]}),
                  json_body=lambda w: {"ids": [w.b_dead, w.plain_dead]}),
        _answered("POST", lambda w: "/dead/retry",
                  lambda w, a: _equal(a.body, {"retried": 1, "missing": []}),
                  json_body={"all": True}),
    ],
    "purge_dead": [
        _refused(404, "POST", lambda w: "/dead/purge",
                 json_body=lambda w: {"endpoint_id": w.b_endpoint}),
        _answered("POST", lambda w: "/dead/purge",
                  lambda w, a: _equal(a.body, {"purged": 0, "missing": [w.b_dead, w.plain_dead]}),
                  json_body=lambda w: {"ids": [w.b_dead, w.plain_dead]}),
        _answered("POST", lambda w: "/dead/purge",
                  lambda w, a: _equal(a.body, {"purged": 1, "missing": []}),
                  json_body={"all": True}),
    ],
    "list_event_types": _operator_only("GET", "/event-types"),
    "show_event_type": _operator_only("GET", "/event-types/order.created"),
    "set_event_type": _operator_only("PUT", "/event-types/order.created",
                                     json_body={"retry_schedule": [1]}),
    "delete_event_type": _operator_only("DELETE", "/event-types/order.created"),
    "list_destinations": _operator_only("GET", "/destinations"),
    "set_destination": _operator_only("PUT", "/destinations",
                                      json_body={"destination": "https://b.example",
                                                 "max_concurrency": 1}),
    "delete_destination": _operator_only("DELETE", "/destinations",
                                         params={"destination": "https://b.example"}),
    "list_tenants": _operator_only("GET", "/tenants"),
    "create_tenant": _operator_only("POST", "/tenants", json_body={"external_id": "initech"}),
    "show_tenant": [*_operator_only("GET", "/tenants/globex"),
                    *_operator_only("GET", "/tenants/acme")],
    "update_tenant": [*_operator_only("PATCH", "/tenants/globex", json_body={"name": "x"}),
                      *_operator_only("PATCH", "/tenants/acme", json_body={"name": "x"})],
    "delete_tenant": [*_operator_only("DELETE", "/tenants/globex"),
                      *_operator_only("DELETE", "/tenants/acme")],
    "list_retention_rules": _operator_only("GET", "/retention-rules"),
    "set_retention_rule": _operator_only("PUT", "/retention-rules",
                                         json_body=lambda w: {"endpoint_id": w.a_endpoint,
                                                              "payload_retention_s": 3600}),
    "delete_retention_rule": _operator_only("DELETE", "/retention-rules",
                                            params={"event_type": "order.created"}),
    "create_portal_link": [*_operator_only("POST", "/tenants/globex/portal-links"),
                           *_operator_only("POST", "/tenants/acme/portal-links")],
    "revoke_portal_links": [*_operator_only("DELETE", "/tenants/globex/portal-links"),
                            *_operator_only("DELETE", "/tenants/acme/portal-links")],
}  # fmt: skip


def _is_acme(tenant: object) -> None:
    assert tenant == "acme"


def _equal(value: object, expected: object) -> None:
    assert value == expected


def test_every_route_is_tried_with_a_tenants_token() -> None:
    assert set(REQUESTS) == {route.operation_id for route in ROUTES}


@pytest.mark.parametrize("operation", sorted(REQUESTS))
async def test_a_tenants_token_reaches_its_own_rows_and_no_one_elses(
    database_url: str, operation: str
) -> None:
    db = Db(database_url)
    async with serving_api(database_url) as api:
        world = await _build(api, db, database_url)
        before = _others(db, world)
        for check in REQUESTS[operation]:
            await check(world)
        assert _others(db, world) == before


async def test_a_tenants_token_cannot_give_an_endpoint_the_filter_that_fails_its_producers_publish(
    database_url: str,
) -> None:
    db = Db(database_url)
    async with serving_api(database_url) as api:
        world = await _build(api, db, database_url)
        own = f"/endpoints/{world.a_endpoint}"
        for method, path, body in [
            ("PATCH", own, {"filter": "total > `1`"}),
            ("PATCH", own, {"filter": None}),
            ("POST", "/endpoints", {"url": "https://a.example/other", "filter": "total > `1`"}),
        ]:
            answer = await world.acme.call(method, path, json_body=body)
            assert answer.status == 403, (method, body, answer.body)
            assert answer.problem["field"] == "body.filter"
        assert db.query("SELECT count(*) FROM outbox.endpoints WHERE filter IS NOT NULL") == [(0,)]
        # the producer's transactions publish for acme, from SQL and from Python
        with db.tx() as conn:
            from_sql = conn.execute(
                "SELECT outbox.publish('order.created', '{\"total\": 5}', tenant => 'acme')"
            ).fetchall()[0][0]
            from_python = Outbox().publish(conn, "order.created", {"total": 5}, tenant="acme")
        assert len(from_sql) == 1 and len(from_python) == 1
        # the operator's token still sets it: the refusal is a tenant's alone
        operators = await api.call("PATCH", own, json_body={"filter": "total > `1`"})
        assert operators.status == 200 and operators.body["filter"] == "total > `1`"
        document = (await api.call("GET", "/openapi.json")).body
    for method, path in (("post", "/endpoints"), ("patch", "/endpoints/{id}")):
        assert "may not give filter" in document["paths"][path][method]["description"]


async def test_a_tenants_token_sees_no_attempts_dispatcher_and_the_operators_does(
    database_url: str,
) -> None:
    db = Db(database_url)
    async with serving_api(database_url) as api:
        world = await _build(api, db, database_url)
        tenants = await world.acme.call("GET", f"/messages/{world.a_dead}")
        operators = await api.call("GET", f"/messages/{world.a_dead}")
        document = (await api.call("GET", "/openapi.json")).body
    assert [a["owner"] for a in operators.body["attempt_log"]] == ["test:1:x"] * 3
    assert [a["owner"] for a in tenants.body["attempt_log"]] == [None] * 3
    assert "test:1:x" not in json.dumps(tenants.body)
    assert "no attempt's owner" in document["paths"]["/messages/{id}"]["get"]["description"]
