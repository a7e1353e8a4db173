"""``outbox dispatch`` serving three databases keeps serving two while the third is
down, and serves the third again once it is back: nothing lost, nothing twice.

The three are schemas of the test's database: two reached directly, one (``west``)
through :class:`TcpProxy`, which takes it away (every connection cut, every new one
refused) and gives it back. The receiver counts idempotency keys.
"""

from __future__ import annotations

import signal
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from dispatchers.runtime.databases import default_label
from outbox import Outbox
from outbox.migrations import migrate
from tests.faults.tcp_proxy import TcpProxy, proxy_target, through
from tests.processes import Fleet, query, wait_until
from tests.receiver import Receiver

pytestmark = pytest.mark.timeout(180)

SCHEMAS = ("outbox", "east", "west")
ARGS = (
    "--lease=6",
    "--request-timeout=2",
    "--connect-timeout=1",
    "--statement-timeout=1",
    "--claim-timeout=1",
    "--poll-interval=0.2",
    "--concurrency=16",
    "--grace=1",
    "--metrics-port=0",
)
"""Bounds for a dispatcher that reaches a database through the proxy."""

TIMEOUT = 60.0


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    with TcpProxy(proxy_target(database_url)) as proxy:
        yield proxy


def enqueue(url: str, schema: str, target: str, keys: list[str]) -> None:
    box = Outbox(schema=schema)
    with psycopg.connect(url) as conn, conn.transaction():
        for key in keys:
            box.enqueue(conn, url=target, idempotency_key=key, json={"key": key})


PASSWORD = "hunter2-never-shown"
"""In west's URL: the embedded server trusts local connections and ignores it."""


def with_password(url: str) -> str:
    parts = urlsplit(url)
    shown = parts._replace(netloc=f"{parts.username}:{PASSWORD}@{parts.netloc.rpartition('@')[2]}")
    return urlunsplit(shown)


def delivered(url: str, schema: str) -> int:
    [(count,)] = query(url, f"SELECT count(*) FROM {schema}.delivered")
    return int(count)


def test_two_databases_are_served_while_the_third_is_down_and_it_is_served_again(
    database_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    for schema in SCHEMAS[1:]:
        migrate(database_url, schema=schema)
    file = tmp_path / "databases.toml"
    file.write_text(
        f'[[database]]\nurl = "{database_url}"\nschema = "east"\n\n'
        f'[[database]]\nurl = "{with_password(through(proxy, database_url))}"\n'
        'schema = "west"\nlabel = "west"\n'
    )
    labels = {
        "outbox": default_label(database_url, "outbox"),
        "east": default_label(database_url, "east"),
        "west": "west",
    }

    def batch(n: int) -> dict[str, list[str]]:
        return {s: [f"{s}-{n}-{i}" for i in range(20)] for s in SCHEMAS}

    with Receiver() as receiver, Fleet(tmp_path) as fleet:
        first, second = batch(1), batch(2)
        for schema, keys in first.items():
            enqueue(database_url, schema, receiver.url, keys)
        process = fleet.start(database_url, "--databases", str(file), *ARGS)
        procs = [process]
        wait_until(
            lambda: all(delivered(database_url, s) == 20 for s in SCHEMAS),
            timeout=TIMEOUT,
            what="the first batch delivered from all three",
            processes=procs,
        )
        [started] = [e for e in process.events() if e["event"] == "fleet_started"]
        assert started["databases"] == [labels[s] for s in SCHEMAS]

        # west goes away: every connection cut, every new one refused
        proxy.refuse(3600)
        proxy.cut()
        for schema, keys in second.items():
            enqueue(database_url, schema, receiver.url, keys)
        wait_until(
            lambda: (
                delivered(database_url, "outbox") == 40 and delivered(database_url, "east") == 40
            ),
            timeout=TIMEOUT,
            what="the two databases still up served",
            processes=procs,
        )

        def west_down() -> str | None:
            with urllib.request.urlopen(started["healthz"], timeout=5) as answer:
                text = str(answer.read().decode())
            return text if "unreachable west" in text else None

        down = wait_until(
            west_down,
            timeout=TIMEOUT,
            what="/healthz to report west unreachable",
            processes=procs,
        )
        assert f"ok {labels['outbox']}\nok {labels['east']}\n" in down
        metrics = urllib.request.urlopen(started["metrics"], timeout=5).read().decode()
        assert 'outbox_database_up{database="west"} 0.0' in metrics
        assert PASSWORD not in metrics
        assert delivered(database_url, "west") == 20  # its second batch waits
        assert process.running()

        proxy.refuse(0)  # west is back
        wait_until(
            lambda: delivered(database_url, "west") == 40,
            timeout=TIMEOUT,
            what="west served again",
            processes=procs,
        )
        process.signal(signal.SIGTERM)
        assert process.wait(30) == 0, process.describe()

    sent = Counter(r.headers["idempotency-key"].strip('"') for r in receiver.requests)
    expected = {key for b in (first, second) for keys in b.values() for key in keys}
    assert set(sent) == expected  # none lost
    assert [k for k, n in sent.items() if n > 1] == []  # none twice
    events = process.events()
    troubled = {e.get("database") for e in events if e["event"] == "db_error"}
    assert troubled == {"west"}, troubled
    assert any(e["event"] == "reconnected" and e["database"] == "west" for e in events)
    assert "stopped; west: delivered 40" in process.stderr()
    assert PASSWORD not in process.stdout() + process.stderr()  # nor in /metrics' labels


def test_a_database_down_at_the_start_is_served_once_it_answers(
    database_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    migrate(database_url, schema="west")
    file = tmp_path / "databases.toml"
    file.write_text(
        f'[[database]]\nurl = "{through(proxy, database_url)}"\nschema = "west"\nlabel = "west"\n'
    )
    proxy.refuse(3600)
    with Receiver() as receiver, Fleet(tmp_path) as fleet:
        for schema in ("outbox", "west"):
            enqueue(database_url, schema, receiver.url, [f"{schema}-{i}" for i in range(10)])
        process = fleet.start(database_url, "--databases", str(file), *ARGS)
        wait_until(
            lambda: delivered(database_url, "outbox") == 10,
            timeout=TIMEOUT,
            what="the database that answers served",
            processes=[process],
        )
        stderr = process.stderr()
        assert "outbox dispatch: west: cannot connect to the database" in stderr
        assert "serving the others, trying it again" in stderr
        proxy.refuse(0)
        wait_until(
            lambda: delivered(database_url, "west") == 10,
            timeout=TIMEOUT,
            what="the database down at the start served once it answers",
            processes=[process],
        )
        process.signal(signal.SIGTERM)
        assert process.wait(30) == 0, process.describe()
    sent = Counter(r.headers["idempotency-key"].strip('"') for r in receiver.requests)
    assert sent == {f"{s}-{i}": 1 for s in ("outbox", "west") for i in range(10)}
