"""Least-privilege roles: ``outbox roles`` grants, and each use runs as its own role.

Each test creates three LOGIN roles on the test server (with a password, so an
external server that asks for one works too), applies the grants with the command,
then connects as each role: the producer enqueues and publishes, the dispatcher
drains, the operator runs the admin commands; and each is refused what it must
not do.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
import trustme
from psycopg import sql
from standardwebhooks.webhooks import Webhook

from dispatchers.cli import main
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from dispatchers.store.postgres import Completion, Store
from dispatchers.store.preflight import check_database
from outbox import Destinations, Outbox, RetentionRules
from outbox.admin import EXPUNGED_BODY
from outbox.endpoints import Endpoints
from outbox.roles import ROLES
from tests.conftest import PgServer
from tests.dispatching import fast_config
from tests.receiver import Receiver, Reply
from tests.transactions import KINDS, open_tx

_counter = itertools.count()


def as_role(url: str, role: str, password: str) -> str:
    """``url`` with another user and password (the host, database and options kept)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(role)}:{quote(password)}@{host}"))


@dataclass
class Roles:
    """The test's roles by kind, and a URL that connects as each."""

    names: dict[str, str]
    urls: dict[str, str]


@contextmanager
def made_roles(pg_server: PgServer, database_url: str) -> Iterator[Roles]:
    """A LOGIN role of each kind on the test server, dropped (with what it owns or
    was granted in the test's database) at the end."""
    run = f"{os.getpid()}_{next(_counter)}"
    names = {kind: f"outbox_{kind}_{run}" for kind in ROLES}
    password = secrets.token_hex(16)
    with pg_server.admin() as admin:
        for name in names.values():
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(password)
                )
            )
    try:
        yield Roles(names, {k: as_role(database_url, n, password) for k, n in names.items()})
    finally:
        everyone = sql.SQL(", ").join(map(sql.Identifier, names.values()))
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(everyone))
        with pg_server.admin() as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(everyone))


@pytest.fixture
def roles(pg_server: PgServer, database_url: str) -> Iterator[Roles]:
    with made_roles(pg_server, database_url) as made:
        yield made


def outbox(url: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``outbox ...`` in-process against ``url``."""
    capsys.readouterr()
    code = main([*argv, "--database-url", url])
    out, err = capsys.readouterr()
    return code, out, err


def grant_all(database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]) -> None:
    options = [arg for kind, name in roles.names.items() for arg in (f"--{kind}", name)]
    code, _, err = outbox(database_url, "roles", *options, "--apply", capsys=capsys)
    assert code == 0, err


def refused(url: str, statement: str, *params: Any) -> None:
    with (
        psycopg.connect(url) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as denied,
    ):
        conn.execute(statement.encode(), params)
    assert denied.value.sqlstate == "42501"  # permission denied, or not the owner


def can(database_url: str, role: str, privilege: str, table: str) -> bool:
    """Whether ``role`` holds ``privilege`` on ``table``, or on one of its columns at
    least (asked as the superuser: a role without usage of the schema cannot even
    name the table)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT has_any_column_privilege(%s, %s, %s)", (role, table, privilege)
        ).fetchone()
    return bool(row and row[0])


def alter_owner(database_url: str, owner: sql.Composable) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SCHEMA outbox OWNER TO {}").format(owner))


# -- the command ---------------------------------------------------------------------


def test_roles_prints_the_grants_and_applies_nothing_without_apply(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    producer = roles.names["producer"]
    code, out, err = outbox(database_url, "roles", "--producer", producer, capsys=capsys)

    assert code == 0, err
    lines = out.splitlines()
    # the columns enqueue and publish write, and no state beyond the first
    assert (
        'GRANT INSERT ("id", "idempotency_key", "target", "destination", "endpoint_id", "url",'
        ' "method", "headers", "body", "content_type", "event_type", "ordering_key", "state",'
        ' "max_attempts", "available_at", "trace_context") ON TABLE "outbox"."messages"'
        f' TO "{producer}";'
    ) in lines
    # the subscriptions of endpoints, not their URL, TLS material nor anything else
    assert (
        'GRANT SELECT ("id", "enabled", "event_types", "filter", "tenant_id")'
        f' ON TABLE "outbox"."endpoints" TO "{producer}";'
    ) in lines
    assert "endpoint_secrets" not in out  # never named: nothing granted, nothing to revoke
    assert not can(database_url, producer, "INSERT", "outbox.messages")

    code, out, err = outbox(
        database_url, "roles", "--producer", producer, "--json", "--apply", capsys=capsys
    )
    assert code == 0, err
    assert json.loads(out)["applied"] is True
    assert can(database_url, producer, "INSERT", "outbox.messages")


@pytest.mark.parametrize(
    ("who", "problem"),
    [
        ("outbox_nobody", "no role named 'outbox_nobody' on this server"),
        ("owner", "owns schema 'outbox': the owner migrates"),
    ],
)
def test_roles_refuses_a_role_it_cannot_grant_to_in_one_line(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], who: str, problem: str
) -> None:
    owner = who == "owner"
    if owner:
        who = roles.names["operator"]
        alter_owner(database_url, sql.Identifier(who))
    try:
        code, out, err = outbox(
            database_url,
            "roles",
            "--producer",
            roles.names["producer"],
            "--dispatcher",
            who,
            "--apply",
            capsys=capsys,
        )
    finally:
        if owner:
            alter_owner(database_url, sql.SQL("CURRENT_USER"))

    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("outbox roles: dispatcher: ")
    assert problem in err
    nothing_applied = not can(database_url, roles.names["producer"], "INSERT", "outbox.messages")
    assert nothing_applied


def test_roles_refuses_a_superuser_and_a_call_without_roles(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT current_user").fetchone()
    assert row
    code, _, err = outbox(database_url, "roles", "--operator", row[0], capsys=capsys)
    assert code == 2
    assert "is a superuser: no grant can restrict it" in err

    code, _, err = outbox(database_url, "roles", capsys=capsys)
    assert code == 2
    assert "name at least one role" in err


# -- each use as its role ------------------------------------------------------------


def test_producer_enqueues_and_publishes_and_reads_no_secret_nor_changes_a_message(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_all(database_url, roles, capsys)
    with psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(conn, url="https://example.com/hooks")
    as_producer = roles.urls["producer"]

    for box in (Outbox(), Outbox(notify=False)):
        with psycopg.connect(as_producer) as conn:
            key = f"k-{box.notify}"
            first = box.enqueue(conn, url="https://example.com/", idempotency_key=key, json={})
            again = box.enqueue(conn, url="https://example.com/", idempotency_key=key, json={})
            published = box.publish(conn, "order.paid", {"n": 1}, idempotency_key=key)
            assert box.publish(conn, "order.paid", {"n": 1}, idempotency_key=key) == published
        assert again == first
        assert len(published) == 1

    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT endpoint_id, state FROM outbox.messages ORDER BY id").fetchall()
    assert rows == [(None, "ready"), (endpoint.id, "ready")] * 2

    refused(as_producer, "SELECT secret FROM outbox.endpoint_secrets")
    refused(as_producer, "UPDATE outbox.messages SET state = 'dead'")
    refused(as_producer, "DELETE FROM outbox.messages")
    refused(as_producer, "DELETE FROM outbox.events")
    refused(as_producer, "SELECT body FROM outbox.messages")
    refused(as_producer, "UPDATE outbox.endpoints SET url = 'https://attacker.example/'")


@pytest.mark.parametrize("kind", KINDS)
async def test_producer_enqueues_and_publishes_through_filters_in_every_kind_of_transaction(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """psycopg and SQLAlchemy, sync and async: each key given twice (the second
    time read back), and an event through the filters of two endpoints."""
    grant_all(database_url, roles, capsys)
    with psycopg.connect(database_url) as conn:
        Endpoints().add(conn, url="https://small.example/", filter="amount < `10`")
        big = Endpoints().add(conn, url="https://big.example/", filter="amount >= `10`")
    box = Outbox()
    async with AsyncExitStack() as stack:
        tx = await open_tx(kind, roles.urls["producer"], stack)
        ids = [
            await tx.call(
                box.enqueue, box.enqueue_async, url="https://example.com/", idempotency_key="k",
                json={"n": 1},
            )
            for _ in range(2)
        ]  # fmt: skip
        events = [
            await tx.call(
                box.publish, box.publish_async, "order.paid", {"amount": 20},
                idempotency_key="evt",
            )
            for _ in range(2)
        ]  # fmt: skip
        await tx.commit()
    assert ids[0] == ids[1]
    assert events[0] == events[1] and len(events[0]) == 1
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT endpoint_id FROM outbox.messages WHERE id = %s", events[0])
        assert row.fetchone() == (big.id,)


def test_producer_publishes_to_an_mtls_endpoint_and_reads_none_of_its_tls_material(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """The client key is stored in plain text without a sealing key: the producer,
    which reads endpoints to fan out, reads their subscriptions and nothing else."""
    grant_all(database_url, roles, capsys)
    ca = trustme.CA()
    issued = ca.issue_cert("dispatcher.example")
    cert = "".join(blob.bytes().decode() for blob in issued.cert_chain_pems)
    key = issued.private_key_pem.bytes().decode()
    with psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(
            conn,
            url="https://partner.example/hooks",
            event_types=["order.*"],
            ca_bundle=ca.cert_pem.bytes().decode(),
            client_cert=cert,
            client_key=key,
            metadata={"team": "billing"},
        )
        stored = conn.execute(
            "SELECT client_key FROM outbox.endpoints WHERE id = %s", (endpoint.id,)
        ).fetchone()
    assert stored == (key,)  # plain text: only the grant keeps it from the producer
    as_producer = roles.urls["producer"]

    with psycopg.connect(as_producer) as conn:
        (message,) = Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="evt")
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT endpoint_id FROM outbox.messages WHERE id = %s", (message,))
        assert row.fetchone() == (endpoint.id,)

    for column in ("client_key", "client_cert", "client_key_id", "ca_bundle", "url"):
        refused(as_producer, f"SELECT {column} FROM outbox.endpoints")
    refused(as_producer, "SELECT * FROM outbox.endpoints")
    refused(as_producer, "SELECT metadata, description FROM outbox.endpoints")
    refused(as_producer, "SELECT secret FROM outbox.endpoint_secrets")


async def test_dispatcher_delivers_signed_and_cannot_change_endpoints_or_secrets(
    database_url: str, roles: Roles, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_all(database_url, roles, capsys)
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        # policies, so that the claim takes (and the rescuer frees) their slots
        endpoint = Endpoints().add(conn, url=receiver.url + "/hooks", rate_limit=100)
        Destinations().set(conn, receiver.url, rate_limit=100, max_concurrency=4)
        box.enqueue(conn, url=receiver.url + "/plain", idempotency_key="plain", json={})
        box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt")
        # a message whose dispatcher died holding it: the rescuer hands it on
        stuck = box.enqueue(conn, url=receiver.url + "/stuck", idempotency_key="stuck", json={})
    as_dispatcher = roles.urls["dispatcher"]
    config = fast_config()
    check_database(as_dispatcher, config)  # what `outbox dispatch` checks at start-up

    store = Store(as_dispatcher, config)
    await store.open()
    try:
        claimed = (await store.claim("gone", 10)).messages
        assert {job.id for job in claimed} >= {stuck}
        held = [(job.id, job.attempts) for job in claimed]
        assert await store.renew("gone", held) == {job.id for job in claimed}
        with psycopg.connect(database_url) as conn:
            conn.execute("UPDATE outbox.messages SET lease_until = now() - interval '1 second'")
        assert {state for _, state in await store.rescue()} == {"ready"}
        # asked after a lost answer: this attempt ended by rescue, not by a recorded outcome
        assert (
            await store.recorded("gone", [Completion(stuck, 1, "delivered", "delivered", True)])
            == set()
        )

        async with asyncio.timeout(30):
            await Dispatcher(as_dispatcher, config, log=NullLog()).run(drain=True)

        with psycopg.connect(database_url) as conn:
            conn.execute("UPDATE outbox.delivered SET completed_at = now() - interval '30 days'")
            conn.execute("UPDATE outbox.key_generation SET carried_at = now() - interval '30 days'")
        assert await store.remove_history(100) == (3,)
        # the generation of keys and event records turns, as the schema's owner
        assert await store.turn_keys() == 2
        assert await store.carry_keys(100) == 0  # every message was delivered
        assert await store.turn_keys() is None  # the next is a retention period away
    finally:
        await store.close()

    paths = sorted(r.path for r in receiver.requests)
    assert paths == ["/hooks", "/plain", "/stuck"]
    (webhook,) = [r for r in receiver.requests if r.path == "/hooks"]
    with psycopg.connect(database_url) as conn:
        secret = Endpoints().require(conn, endpoint.id).secrets[0].secret
    assert Webhook(secret).verify(webhook.body, webhook.headers)["data"] == {"n": 1}

    refused(as_dispatcher, "UPDATE outbox.endpoints SET url = 'https://attacker.example/'")
    refused(as_dispatcher, "UPDATE outbox.endpoints SET event_types = '{}'")
    refused(as_dispatcher, "UPDATE outbox.endpoint_secrets SET secret = 'whsec_x'")
    refused(
        as_dispatcher,
        "INSERT INTO outbox.endpoint_secrets (endpoint_id, secret) VALUES (%s, 'whsec_x')",
        endpoint.id,
    )
    refused(as_dispatcher, "DELETE FROM outbox.endpoint_secrets")
    refused(as_dispatcher, "INSERT INTO outbox.messages (idempotency_key) VALUES ('x')")
    refused(as_dispatcher, "UPDATE outbox.events SET message_ids = '{}'")
    refused(as_dispatcher, "UPDATE outbox.destination_policies SET max_concurrency = 100")
    refused(as_dispatcher, "UPDATE outbox.rate_slots SET period = interval '0'")
    refused(as_dispatcher, "DELETE FROM outbox.destination_slots")
    refused(as_dispatcher, "UPDATE outbox.endpoints SET retry_schedule = '{1}'")
    refused(as_dispatcher, "INSERT INTO outbox.event_types VALUES ('a', '{1}')")
    # what a message says and where it goes
    refused(as_dispatcher, "UPDATE outbox.messages SET url = 'https://attacker.example/'")
    refused(as_dispatcher, "UPDATE outbox.messages SET body = 'x'")
    refused(as_dispatcher, "UPDATE outbox.messages SET headers = '{}'")
    refused(as_dispatcher, "UPDATE outbox.messages SET endpoint_id = NULL")
    refused(as_dispatcher, "UPDATE outbox.messages SET max_attempts = 100")
    refused(as_dispatcher, "UPDATE outbox.delivered SET body = 'x'")
    # an endpoint's subscriptions and TLS material
    refused(as_dispatcher, "SELECT event_types, filter FROM outbox.endpoints")
    refused(as_dispatcher, "UPDATE outbox.endpoints SET client_key = NULL, client_cert = NULL")


@pytest.mark.slow
async def test_dispatcher_disables_an_endpoint_that_is_gone_and_cannot_enable_it_again(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dispatcher writes the column enabled (to disable); a column privilege
    cannot tell the values apart, a trigger refuses it the other way."""
    grant_all(database_url, roles, capsys)
    with (
        Receiver(lambda _: Reply(status=410)) as gone,
        Receiver() as pager,
        psycopg.connect(database_url) as conn,
    ):
        endpoint = Endpoints().add(conn, url=gone.url + "/hooks", event_types=["order.*"])
        Endpoints().add(conn, url=pager.url, event_types=["outbox.*"])
        Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="evt")
        conn.commit()
        as_dispatcher = roles.urls["dispatcher"]
        async with asyncio.timeout(30):
            await Dispatcher(as_dispatcher, fast_config(), log=NullLog()).run(drain=True)
        # the alerts its statements raised, written as the schema's owner (it may not
        # insert a message), and one it raises itself
        store = Store(as_dispatcher, fast_config())
        await store.open()
        try:
            assert await store.alert_lag(120.0, 60.0, None) == "exceeded"
        finally:
            await store.close()
        await asyncio.to_thread(pager.wait_for, 2)
    assert len(gone.requests) == 1
    assert sorted(json.loads(r.body)["type"] for r in pager.requests[:2]) == [
        "outbox.endpoint.disabled",
        "outbox.message.dead",
    ]
    with psycopg.connect(database_url) as conn:
        waiting = conn.execute(
            "SELECT event_type FROM outbox.messages WHERE event_type LIKE 'outbox.%'"
        ).fetchall()
    assert waiting == [("outbox.lag.exceeded",)]
    with psycopg.connect(database_url) as conn:
        disabled = Endpoints().require(conn, endpoint.id)
    assert not disabled.enabled
    assert disabled.disabled_reason == "the endpoint answered 410 Gone"

    # the column is granted (the dispatcher disables): the refusal is the trigger's
    with psycopg.connect(database_url) as conn:
        granted = conn.execute(
            "SELECT has_column_privilege(%s, 'outbox.endpoints', 'enabled', 'UPDATE')",
            (roles.names["dispatcher"],),
        ).fetchone()
    assert granted == (True,)
    enable = "UPDATE outbox.endpoints SET enabled = true WHERE id = %s"
    refused(as_dispatcher, enable, endpoint.id)
    refused(
        as_dispatcher,
        "UPDATE outbox.endpoints SET enabled = true, disabled_at = NULL, disabled_reason = NULL,"
        " failure_streak = 0 WHERE id = %s",
        endpoint.id,
    )
    refused(roles.urls["producer"], enable, endpoint.id)
    with psycopg.connect(as_dispatcher) as conn:
        # health it may still record on the disabled endpoint, and disabling is not enabling
        conn.execute(
            "UPDATE outbox.endpoints SET failure_streak = 0, enabled = false WHERE id = %s",
            (endpoint.id,),
        )
    code, _, err = outbox(
        roles.urls["operator"], "endpoints", "enable", str(endpoint.id), capsys=capsys
    )
    assert code == 0, err
    with psycopg.connect(database_url) as conn:
        assert Endpoints().require(conn, endpoint.id).enabled
        conn.execute(enable.replace("true", "false"), (endpoint.id,))
        conn.execute(enable, (endpoint.id,))  # the schema's owner may too


def test_operator_runs_the_admin_commands_and_cannot_change_the_schema(
    database_url: str, roles: Roles, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_all(database_url, roles, capsys)
    as_operator = roles.urls["operator"]

    def admin(*argv: str) -> Any:
        code, out, err = outbox(as_operator, *argv, "--json", capsys=capsys)
        assert code == 0, (argv, err)
        return json.loads(out)

    endpoint = admin("endpoints", "add", receiver.url, "--event-type", "order.*")["id"]
    admin("endpoints", "update", str(endpoint), "--description", "billing")
    admin("endpoints", "rotate-secret", str(endpoint))
    assert len(admin("endpoints", "show", str(endpoint), "--show-secrets")["secrets"]) == 2
    admin("endpoints", "disable", str(endpoint))
    admin("endpoints", "enable", str(endpoint))
    admin("endpoints", "list")
    admin("endpoints", "update", str(endpoint), "--retry-schedule", "1m,1h")
    admin("event-types", "set", "order.paid", "--retry-schedule", "5s,1m")
    listed = [t["event_type"] for t in admin("event-types", "list")]
    assert [t for t in listed if not t.startswith("outbox.")] == ["order.paid"]

    with psycopg.connect(database_url) as conn:
        (dead,) = Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="evt")
        conn.execute(
            "UPDATE outbox.messages SET state = 'dead', completed_at = now() WHERE id = %s",
            (dead,),
        )
    assert [m["id"] for m in admin("dead", "list")] == [dead]
    admin("messages", "show", str(dead))
    # an old event to an endpoint subscribed since, and a test event: new messages,
    # whose ids come from the messages sequence
    later = admin("endpoints", "add", receiver.url + "/later")["id"]
    assert admin("replay", "--endpoint", str(later), "--event", "evt")["created"]
    admin("endpoints", "test", str(later))
    admin("dead", "retry", str(dead))
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE outbox.messages SET state = 'dead', completed_at = now() WHERE id = %s",
            (dead,),
        )
    admin("dead", "purge", str(dead), "--yes")
    admin("replay", "--endpoint", str(endpoint), "--since", "1h")
    admin("status")
    admin("endpoints", "delete", str(endpoint), "--yes")

    refused(as_operator, "CREATE TABLE outbox.sneaky (id int)")
    refused(as_operator, "ALTER TABLE outbox.messages ADD COLUMN sneaky int")
    refused(as_operator, "DELETE FROM outbox.schema_migrations")


async def test_the_dispatcher_erases_payloads_past_a_rule_through_the_function_alone(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """A retention rule changes bodies, which the dispatcher's grants do not let
    it touch: it runs expire_payloads, as the schema's owner (migration 0029)."""
    grant_all(database_url, roles, capsys)
    with Receiver() as receiver, psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(conn, url=receiver.url).id
        Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="evt")
        RetentionRules().set(conn, endpoint_id=endpoint, payload_retention=24 * 3600)
        conn.commit()
        async with asyncio.timeout(30):
            await Dispatcher(roles.urls["dispatcher"], fast_config(), log=NullLog()).run(drain=True)
        conn.execute("UPDATE outbox.delivered SET completed_at = now() - interval '2 days'")
        conn.commit()
    as_dispatcher = roles.urls["dispatcher"]
    refused(as_dispatcher, "UPDATE outbox.delivered SET body = 'x'")

    store = Store(as_dispatcher, fast_config())
    await store.open()
    try:
        (served,) = await store.expire_payloads(100)
    finally:
        await store.close()

    assert served.erased == 1
    with psycopg.connect(database_url) as conn:
        bodies = conn.execute("SELECT body FROM outbox.delivered").fetchall()
    assert bodies == [(EXPUNGED_BODY,)]
