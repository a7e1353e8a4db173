"""Retry schedules per endpoint and per event type, and a receiver stopping the
retries of a message, against real PostgreSQL and a real receiver on 127.0.0.1.

The dispatcher's own webhook schedule here is :data:`tests.dispatching.FAST`'s
(50 ms), so a gap of most of a second between attempts is the stored schedule's.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog, NullLog
from outbox import EventTypes, Outbox
from outbox.endpoints import Endpoints
from tests.database import Db
from tests.dispatching import fast_config, wait_until
from tests.receiver import Receiver, Reply

FAILING = Reply(status=503)


def publish(db: Db, event_type: str, *, max_attempts: int) -> list[int]:
    with psycopg.connect(db.url) as conn:
        return Outbox(webhook_max_attempts=max_attempts).publish(conn, event_type, {})


def add_endpoint(db: Db, url: str, **kwargs: Any) -> int:
    with psycopg.connect(db.url) as conn:
        return Endpoints().add(conn, url=url, **kwargs).id


def gaps(db: Db, message_id: int) -> list[float]:
    """Seconds between the starts of the message's attempts, in order."""
    starts = [
        row[0]
        for row in db.query(
            "SELECT started_at FROM outbox.attempts WHERE message_id = %s ORDER BY attempt",
            message_id,
        )
    ]
    return [(b - a) / timedelta(seconds=1) for a, b in pairwise(starts)]


async def until_dead(db: Db, ids: list[int], seconds: float) -> None:
    dispatcher = Dispatcher(db.url, fast_config(), log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        dead = "SELECT count(*) FROM outbox.messages WHERE state = 'dead' AND id = ANY(%s)"
        await wait_until(lambda: db.query(dead, ids) == [(len(ids),)], seconds=seconds)
    finally:
        dispatcher.stop()
        async with asyncio.timeout(15):
            await task


@pytest.mark.slow
async def test_an_endpoints_schedule_comes_first_then_its_event_types(
    database_url: str, receiver: Receiver
) -> None:
    receiver.responder = lambda request: FAILING
    db = Db(database_url)
    with psycopg.connect(db.url) as conn:
        EventTypes().set(conn, "order.created", retry_schedule=[1.0])
    own = add_endpoint(db, receiver.url + "/own", retry_schedule=[2.0, 0.5])
    add_endpoint(db, receiver.url + "/none")
    ids = publish(db, "order.created", max_attempts=4)
    endpoint_of = dict(db.query("SELECT id, endpoint_id FROM outbox.messages"))
    (mine,) = [i for i in ids if endpoint_of[i] == own]
    (theirs,) = [i for i in ids if endpoint_of[i] != own]

    await until_dead(db, ids, seconds=20)

    # generous upper bounds: a claim follows a due retry within a poll or two
    slack = 1.5
    first, *repeated = gaps(db, mine)
    assert 2.0 * 0.9 <= first <= 2.0 * 1.1 + slack  # the endpoint's, not the event type's
    assert len(repeated) == 2  # the last delay repeats
    assert all(0.5 * 0.9 <= gap <= 0.5 * 1.1 + slack for gap in repeated)
    event_type_gaps = gaps(db, theirs)
    assert len(event_type_gaps) == 3
    assert all(1.0 * 0.9 <= gap <= 1.0 * 1.1 + slack for gap in event_type_gaps)


async def test_a_receiver_stops_retries_with_the_abort_header(
    database_url: str, receiver: Receiver
) -> None:
    receiver.responder = lambda request: Reply(status=503, headers={"Outbox-Abort": "true"})
    db = Db(database_url)
    add_endpoint(db, receiver.url)
    (message_id,) = publish(db, "order.created", max_attempts=8)
    stream = io.StringIO()
    dispatcher = Dispatcher(db.url, fast_config(), log=EventLog(stream=stream, format="json"))
    async with asyncio.timeout(30):
        await dispatcher.run(drain=True)

    assert len(receiver.requests) == 1
    ((state, attempts, last_error, last_status),) = db.query(
        "SELECT state, attempts, last_error, last_status FROM outbox.messages WHERE id = %s",
        message_id,
    )
    assert (state, attempts, last_status) == ("dead", 1, 503)
    assert last_error == (
        "the receiver stopped retries (HTTP 503 Service Unavailable with Outbox-Abort: true)"
    )
    assert db.query("SELECT outcome, error_class FROM outbox.attempts") == [("failed", "aborted")]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    (dead,) = [e for e in events if e["event"] == "dead"]
    assert (dead["message_id"], dead["error_class"]) == (message_id, "aborted")


def outbox(database_url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run ``outbox ARGV`` in-process: its exit status and what it printed."""
    capsys.readouterr()
    try:
        code = main([*argv, "--database-url", database_url])
    except SystemExit as exc:  # argparse refused the command line
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out + err


def test_schedules_are_set_shown_and_dropped_from_the_command_line(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*argv: str) -> Any:
        code, out = outbox(database_url, capsys, *argv, "--json")
        assert code == 0, out
        return json.loads(out)

    endpoint = run("endpoints", "add", "https://example.com/x", "--retry-schedule", "5s,1m")
    assert endpoint["retry_schedule"] == [5.0, 60.0]
    updated = run("endpoints", "update", str(endpoint["id"]), "--retry-schedule", "10m,1h")
    assert updated["retry_schedule"] == [600.0, 3600.0]
    code, shown = outbox(database_url, capsys, "endpoints", "show", str(endpoint["id"]))
    assert code == 0 and "retry schedule   10m,1h" in shown
    cleared = run("endpoints", "update", str(endpoint["id"]), "--no-retry-schedule")
    assert cleared["retry_schedule"] is None

    assert run("event-types", "set", "order.created", "--retry-schedule", "1m,1h,1d")[
        "retry_schedule"
    ] == [60.0, 3600.0, 86400.0]
    run("event-types", "set", "order.created", "--retry-schedule", "30s")  # replaces it

    def listed() -> list[tuple[str, list[float]]]:
        """The event types set, but the outbox's own (its alerts, migration 0028)."""
        return [
            (t["event_type"], t["retry_schedule"])
            for t in run("event-types", "list")
            if not t["event_type"].startswith("outbox.")
        ]

    assert listed() == [("order.created", [30.0])]
    code, text = outbox(database_url, capsys, "event-types", "list")
    assert code == 0 and re.search(r"^order\.created +30s ", text, flags=re.M), text
    assert run("event-types", "delete", "order.created")["deleted"] is True
    assert listed() == []
    code, out = outbox(database_url, capsys, "event-types", "delete", "order.created")
    assert code == 2 and "event_type: no settings for event type 'order.created'" in out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["endpoints", "add", "https://x.example", "--retry-schedule", ""], "--retry-schedule"),
        (["endpoints", "add", "https://x.example", "--retry-schedule=-5s"], "--retry-schedule"),
        (["endpoints", "add", "https://x.example", "--retry-schedule", "0s"], "--retry-schedule"),
        (["event-types", "set", "a.b", "--retry-schedule", "5s,8d"], "--retry-schedule"),
        (["event-types", "set", "a.b", "--retry-schedule", "soon"], "--retry-schedule"),
        (["event-types", "set", "a b", "--retry-schedule", "5s"], "event_type"),
    ],
)
def test_a_bad_schedule_is_a_usage_error_naming_the_option_and_writes_nothing(
    database_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    code, out = outbox(database_url, capsys, *argv)
    assert code == 2
    assert named in out
    db = Db(database_url)
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]
    assert db.query(
        "SELECT count(*) FROM outbox.event_types WHERE event_type NOT LIKE 'outbox.%%'"
    ) == [(0,)]
