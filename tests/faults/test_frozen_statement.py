"""A dispatcher frozen just after sending a statement must not keep its rows.

A process can stop at any instruction (SIGSTOP, a paused VM, a stalled network):
here, between writing its lease renewal and writing the COMMIT that ends it. Its
leases must then expire and be rescued like a dead dispatcher's. They are not
if the server is left holding the renewal's row locks: the rescuer's SKIP LOCKED
passes the rows by for as long as the process stays frozen, and no timeout of
PostgreSQL's ends that wait (a backend reading the rest of an extended-protocol
pipeline is not "idle in transaction", so idle_in_transaction_session_timeout
never starts, and statement_timeout ended with the statement).

:class:`~tests.faults.freeze_proxy.FreezeProxy` sits between the dispatcher and
PostgreSQL and freezes the dispatcher at exactly that point: right after the
first renewal statement has gone out in full, holding back whatever it wrote
after it. A second dispatcher, connected directly, must then rescue and deliver
every message while the first is still frozen.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.faults.freeze_proxy import FreezeProxy
from tests.processes import Fleet, enqueue_many, query, wait_until
from tests.receiver import Received, Receiver, Reply

# lease 9 >= 1.5 x (request 4 + flush 0.05 + statement 1.5); renewed every 3 s
ARGS = (
    "--lease",
    "9",
    "--request-timeout",
    "4",
    "--connect-timeout",
    "0.5",
    "--statement-timeout",
    "1.5",
    "--claim-timeout",
    "1.5",
    "--grace",
    "1",
    "--concurrency",
    "4",
    "--destination-concurrency",  # every message at the one receiver at once
    "4",
)
RENEW_MARKER = b"AS held(id, attempt)"  # only the renew statement has this


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


def upstream_of(url: str) -> tuple[str | tuple[str, int], dict[str, str]]:
    params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    host = params.get("host", "")
    port = params.get("port", "5432")
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}", params
    return (host or "127.0.0.1", int(port)), params


@pytest.mark.faults
@pytest.mark.timeout(120)
def test_dispatcher_frozen_after_sending_a_statement_holds_no_row(
    database_url: str, fleet: Fleet
) -> None:
    upstream, params = upstream_of(database_url)
    renewed = threading.Event()

    def reply(req: Received) -> Reply:
        # hold the first dispatcher's requests across its first renewal
        renewed.wait(3.5)
        return Reply()

    with (
        tempfile.TemporaryDirectory(prefix="pgfreeze-") as socket_dir,
        Receiver(reply) as receiver,
    ):
        frozen: list[int] = []

        def freeze() -> None:
            frozen.append(first.pid)
            first.signal(signal.SIGSTOP)
            renewed.set()

        with FreezeProxy(upstream, Path(socket_dir), RENEW_MARKER, freeze) as proxy:
            proxied = (
                f"postgresql://{quote(params.get('user', ''))}@/{quote(params['dbname'])}"
                f"?host={quote(socket_dir)}&port=5432"
            )
            if params.get("password"):
                proxied += f"&password={quote(params['password'])}"
            ids = enqueue_many(database_url, f"{receiver.url}/hook", [f"f-{i}" for i in range(4)])
            first = fleet.start(proxied, *ARGS)
            try:
                assert proxy.triggered.wait(20), first.describe()
                held = dict(
                    query(
                        database_url,
                        "SELECT id, attempts FROM outbox.messages"
                        " WHERE state = 'running' AND starts_with(lease_owner, %s)",
                        (first.owner_prefix,),
                    )
                )
                assert sorted(held) == sorted(ids), held

                # The frozen dispatcher's leases expire; another one rescues and
                # delivers its messages while it is still frozen.
                second = fleet.start(database_url, *ARGS, "--drain")
                rc = second.wait(timeout=40)
                assert rc == 0, second.describe()
                assert first.running()
                rows = query(
                    database_url,
                    "SELECT message_id, attempt, outcome FROM outbox.attempts"
                    " WHERE starts_with(owner, %s)",
                    (first.owner_prefix,),
                )
                assert sorted(rows) == sorted(
                    (mid, attempt, "lease_expired") for mid, attempt in held.items()
                )
                delivered = dict(query(database_url, "SELECT id, attempts FROM outbox.delivered"))
                assert delivered == {mid: attempt + 1 for mid, attempt in held.items()}
            finally:
                if frozen:
                    first.signal(signal.SIGCONT)
                proxy.release()

            # Thawed, it finds its leases gone, writes nothing, and stops cleanly.
            wait_until(
                lambda: any(e["event"] == "lease_lost" for e in first.events()),
                timeout=20,
                what="the thawed dispatcher to notice its lost leases",
                processes=[first],
            )
            first.signal(signal.SIGTERM)
            assert first.wait(timeout=20) == 0, first.describe()
    rows = query(
        database_url,
        "SELECT outcome, count(*) FROM outbox.attempts WHERE starts_with(owner, %s)"
        " GROUP BY outcome",
        (first.owner_prefix,),
    )
    assert rows == [("lease_expired", len(ids))]
