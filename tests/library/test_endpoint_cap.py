"""A per-endpoint concurrency cap holds across dispatcher processes."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from outbox import Outbox
from outbox.endpoints import Endpoints
from tests.processes import Fleet, scalar
from tests.receiver import ConcurrencyMeter, Receiver

RELAXED = ("--request-timeout", "10", "--connect-timeout", "5", "--lease", "30")


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_cap_is_never_exceeded_by_two_dispatcher_processes(
    database_url: str, tmp_path: Path
) -> None:
    meter = ConcurrencyMeter(delay=0.05)
    with Receiver(meter) as receiver, Fleet(tmp_path) as fleet:
        with psycopg.connect(database_url) as conn:
            endpoints = Endpoints()
            endpoints.add(conn, url=receiver.url + "/capped", max_concurrency=3)
            endpoints.add(conn, url=receiver.url + "/free")
            box = Outbox()
            for i in range(150):
                box.publish(conn, "tick", {"i": i}, idempotency_key=f"tick-{i}")
        procs = [
            fleet.start(
                database_url, *RELAXED, "--concurrency", "16", "--allow-private-networks", "--drain"
            )
            for _ in range(2)
        ]
        for proc in procs:
            assert proc.wait(timeout=80) == 0, proc.describe()
    assert scalar(database_url, "SELECT count(*) FROM outbox.delivered") == 300
    assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == 0
    # every slot is free again
    assert (
        scalar(
            database_url,
            "SELECT count(*) FROM outbox.destination_slots WHERE message_id IS NOT NULL",
        )
        == 0
    )
    assert meter.peak["/capped"] == 3  # reached, never exceeded
    assert meter.peak["/free"] > 3  # the uncapped endpoint was not held back


def test_lowering_the_cap_removes_free_slots(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        endpoints = Endpoints()
        endpoint = endpoints.add(conn, url="https://example.com/hook", max_concurrency=5)
        assert scalar_in(conn, endpoint.id) == 5
        endpoints.update(conn, endpoint.id, max_concurrency=2)
        assert scalar_in(conn, endpoint.id) == 2
        endpoints.update(conn, endpoint.id, clear_max_concurrency=True)
        assert scalar_in(conn, endpoint.id) == 0


def scalar_in(conn: psycopg.Connection[tuple[object, ...]], endpoint_id: int) -> int:
    row = conn.execute(
        "SELECT count(*) FROM outbox.destination_slots WHERE destination = %s",
        (f"endpoint:{endpoint_id}",),
    ).fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]
