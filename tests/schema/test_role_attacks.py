"""What a role may write never steers a delivery, and no function widens its caller.

Each test replays an attack with a role's own grants (``outbox roles --apply``),
as an attacker holding that role would try it, and shows it refused; the schema's
functions are listed from the catalog and each must be a decision of
:data:`outbox.roles.DEFINERS` with its search path pinned.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import Outbox
from outbox.admin import EXPUNGED_BODY
from outbox.endpoints import Endpoints
from outbox.roles import DEFINERS, INVOKERS
from outbox.tenants import Tenants
from tests.conftest import PgServer
from tests.dispatching import fast_config
from tests.receiver import Receiver
from tests.schema.test_roles import Roles, grant_all, made_roles, refused
from tests.store.test_partitions import add_past_days, partitions, today

EXFIL = (
    "INSERT INTO outbox.messages (id, idempotency_key, target, destination, endpoint_id, url,"
    " method, headers, body, content_type, event_type, state, max_attempts)"
    " VALUES (nextval('outbox.messages_id_seq'), %s, %s, %s, %s, %s, 'POST', '{}',"
    " convert_to('{}', 'UTF8'), 'application/json', %s, 'ready', 1)"
)


@pytest.fixture
def roles(pg_server: PgServer, database_url: str) -> Iterator[Roles]:
    with made_roles(pg_server, database_url) as made:
        yield made


def insert_as(url: str, *params: object) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(EXFIL, params)


@pytest.mark.every_server
async def test_the_producer_cannot_send_an_endpoints_message_to_a_url_of_its_own(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's raw INSERT naming endpoint 1 and a URL of the attacker's: the
    dispatcher would send the endpoint's bearer token and signature there."""
    grant_all(database_url, roles, capsys)
    with Receiver() as endpoint_url, Receiver() as attacker:
        with psycopg.connect(database_url) as conn:
            endpoint = Endpoints().add(conn, url=endpoint_url.url, bearer_token="tok-secret-1")
        producer = roles.urls["producer"]
        target = f"endpoint:{endpoint.id}"
        with pytest.raises(psycopg.errors.CheckViolation):
            insert_as(producer, "exfil-1", target, target, endpoint.id, attacker.url, None)
        # nor as a plain message of the endpoint's destination (its caps, its breaker)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            insert_as(producer, "exfil-2", attacker.url, target, None, attacker.url, None)
        # an endpoint's message without a URL is what publish writes: it goes to the endpoint
        insert_as(producer, "plain-3", target, target, endpoint.id, None, "order.paid")
        async with asyncio.timeout(30):
            await Dispatcher(roles.urls["dispatcher"], fast_config(), log=NullLog()).run(drain=True)
        assert attacker.requests == []
        (request,) = endpoint_url.requests
        assert request.headers["authorization"] == "Bearer tok-secret-1"


def test_the_producer_reads_no_key_but_its_own(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keys' targets held every plain message's URL, query string included, which
    the producer's grants let it read; it finds its own key by the key alone."""
    grant_all(database_url, roles, capsys)
    secret_url = "https://partner.example/hook?api_key=s3cret"
    with psycopg.connect(database_url) as conn:
        mine = Outbox().enqueue(conn, url=secret_url, idempotency_key="theirs", json={})
    producer = roles.urls["producer"]
    for table in ("message_keys", "message_keys_old"):
        refused(producer, f"SELECT target FROM outbox.{table}")
        refused(producer, f"SELECT count(*) FROM outbox.{table} WHERE target LIKE '%%api_key%%'")
    with psycopg.connect(producer) as conn:
        # its own key, by the key: the same message, as enqueue's retry finds it
        again = Outbox().enqueue(conn, url=secret_url, idempotency_key="theirs", json={})
        found = conn.execute(
            "SELECT message_id FROM outbox.key_lookup(%s, %s)", (secret_url, "theirs")
        ).fetchall()
    assert again == mine and found == [(mine,)]


def test_the_producer_cannot_forge_an_outbox_alert(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_all(database_url, roles, capsys)
    with psycopg.connect(database_url) as conn:
        pager = Endpoints().add(conn, url="https://pager.example/hooks", event_types=["outbox.*"])
    target = f"endpoint:{pager.id}"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"outbox\.lag\.exceeded"):
        insert_as(
            roles.urls["producer"], "forged", target, target, pager.id, None, "outbox.lag.exceeded"
        )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor the dispatcher
        insert_as(roles.urls["dispatcher"], "forged", target, target, pager.id, None, "outbox.x")
    # the operator may (replaying a dead alert): it may change the endpoint's URL anyway
    insert_as(roles.urls["operator"], "replayed", target, target, pager.id, None, "outbox.x")


@pytest.mark.parametrize(
    "call",
    [
        "SELECT outbox.key_generation_turn(interval '1 microsecond')",
        "SELECT outbox.key_generation_turn(interval '59 minutes')",
        "SELECT outbox.history_drop('delivered_default', interval '1 microsecond')",
    ],
)
def test_the_dispatcher_cannot_ask_for_a_retention_under_the_floor(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], call: str
) -> None:
    """Twice ``key_generation_turn('1 microsecond')`` with carries between erased
    every key and event record: events were then delivered twice."""
    grant_all(database_url, roles, capsys)
    with (
        psycopg.connect(roles.urls["dispatcher"]) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="at least an hour"),
    ):
        conn.execute(call)
    with psycopg.connect(roles.urls["dispatcher"]) as conn:
        assert conn.execute("SELECT outbox.key_generation_turn(interval '1 hour')").fetchone() == (
            None,  # not due: the carry into the current generation is not an hour old
        )


def test_the_dispatcher_drops_through_history_drop_no_partition_inside_the_retention(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dispatcher's maintenance picks the partitions past its retention before
    it calls ``history_drop``; the function, which drops as the schema's owner what
    the dispatcher's role cannot, must refuse the others itself. The retention is
    the partition's age to the microsecond (``now()`` is the transaction's, the
    function's too): one more and it is kept, exactly that and it is dropped."""
    grant_all(database_url, roles, capsys)
    add_past_days(database_url, 2)
    day = today() - timedelta(days=2)  # ended yesterday at 00:00 UTC: over the hour's floor
    ended = day + timedelta(days=1)
    names = [f"{parent}_p{day:%Y%m%d}" for parent in ("delivered", "attempts")]
    drop = "SELECT outbox.history_drop(%s, now() - %s + %s)"
    with psycopg.connect(roles.urls["dispatcher"]) as conn:
        kept = [conn.execute(drop, (n, ended, timedelta(microseconds=1))).fetchone() for n in names]
    assert kept == [(False,), (False,)]
    assert set(names) <= set(partitions(database_url))
    with psycopg.connect(roles.urls["dispatcher"]) as conn:
        dropped = [conn.execute(drop, (n, ended, timedelta(0))).fetchone() for n in names]
    assert dropped == [(True,), (True,)]
    assert not set(names) & set(partitions(database_url))


def test_the_dispatcher_cannot_choose_what_an_erasure_writes(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """``expire_payloads`` took the marker it wrote into delivered bodies, which the
    tenant's portal shows; it now writes the erasure's own."""
    grant_all(database_url, roles, capsys)
    with (
        psycopg.connect(roles.urls["dispatcher"]) as conn,
        pytest.raises(psycopg.errors.UndefinedFunction),
    ):
        conn.execute("SELECT * FROM outbox.expire_payloads(10, convert_to('<b>x</b>', 'UTF8'))")
    with psycopg.connect(database_url) as conn:
        source = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE oid = 'outbox.expire_payloads(integer)'::regprocedure"
        ).fetchone()
    assert source is not None and EXPUNGED_BODY.decode() in source[0]


@pytest.mark.every_server  # PostgreSQL 14 lets every role CREATE in public
def test_the_dispatcher_cannot_enable_an_endpoint_through_a_search_path_hijack(
    pg_server: PgServer, database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the role may CREATE in public (PostgreSQL 14's default, granted here on
    later versions), its own has_column_privilege earlier on its search path than
    pg_catalog's stood in for the one the trigger endpoint_enable_check calls."""
    grant_all(database_url, roles, capsys)
    dispatcher = roles.names["dispatcher"]
    with psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(conn, url="https://a.example/hooks")
        Endpoints().disable(conn, endpoint.id, reason="compromised")
        conn.execute(
            sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(dispatcher))
        )
    with psycopg.connect(roles.urls["dispatcher"]) as conn:
        conn.execute(
            "CREATE FUNCTION public.has_column_privilege(oid, text, text) RETURNS boolean"
            " LANGUAGE sql AS 'SELECT true'"
        )
        conn.execute("SET search_path = public, pg_catalog")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="enable endpoint"):
            conn.execute("UPDATE outbox.endpoints SET enabled = true WHERE id = %s", (endpoint.id,))
    with psycopg.connect(database_url) as conn:
        assert not Endpoints().require(conn, endpoint.id).enabled


def test_a_tenant_toggling_its_endpoint_reaches_the_operators_alerts_once_an_hour_without_its_text(
    database_url: str,
) -> None:
    """A tenant looping disable and enable (through the API or the portal, which
    change the endpoint as below) raised an alert each time, carrying its own
    description and reason."""
    with psycopg.connect(database_url) as conn:
        Tenants().add(conn, "acme", name="Acme")
        pager = Endpoints().add(conn, url="https://pager.example/hooks", event_types=["outbox.*"])
        theirs = Endpoints().add(
            conn,
            url="https://acme.example/hooks",
            description="<script>x</script>",
            tenant="acme",
        )
        for n in range(20):
            Endpoints().disable(conn, theirs.id, reason=f"<h1>call 555-{n:04}</h1>" * 20)
            Endpoints().enable(conn, theirs.id)
        alerts = conn.execute(
            "SELECT id, body FROM outbox.messages WHERE endpoint_id = %s", (pager.id,)
        ).fetchall()
        # the operator's own endpoint keeps its description in its alert
        ours = Endpoints().add(conn, url="https://ours.example/hooks", description="billing")
        Endpoints().disable(conn, ours.id, reason="maintenance")
        own = conn.execute(
            "SELECT id, body FROM outbox.messages WHERE endpoint_id = %s AND id > %s",
            (pager.id, max(a[0] for a in alerts)),
        ).fetchall()
    assert len(alerts) == 1
    data = json.loads(bytes(alerts[0][1]))["data"]
    assert data["endpoint_id"] == theirs.id and data["tenant"] == "acme"
    assert "description" not in data or data["description"] is None
    assert len(data["reason"]) == 200
    (mine,) = [json.loads(bytes(r[1]))["data"] for r in own]
    assert (mine["endpoint_id"], mine["description"]) == (ours.id, "billing")


def test_every_function_of_the_schema_is_a_decision_with_its_search_path_pinned(
    database_url: str,
) -> None:
    """A function the schema installs runs as its owner (SECURITY DEFINER) or as its
    caller on purpose, as outbox.roles records; its search path is pinned; one that
    runs as the owner may be called by no one it is not granted to. A new function
    fails this until it is decided."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            "SELECT p.proname, p.prosecdef, p.proconfig,"
            "       has_function_privilege('public', p.oid, 'EXECUTE')"
            " FROM pg_proc AS p WHERE p.pronamespace = 'outbox'::regnamespace"
        ).fetchall()
    assert {name for name, *_ in found} == DEFINERS | INVOKERS
    for name, definer, config, public in found:
        assert definer == (name in DEFINERS), name
        assert "search_path=pg_catalog, outbox, pg_temp" in (config or []), name
        if definer:
            assert not public, f"{name} runs as the owner and anyone may call it"
