"""What ``outbox dispatch`` tells its operator: a ``started`` event once it is
ready (how it runs, where its health endpoints are), and at the end of a drain a
summary and an exit status that tell a clean drain from one in which messages
went dead."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchers.cli import main
from dispatchers.cli._exit import ExitCode
from tests.processes import Fleet, enqueue_many, wait_until
from tests.receiver import Received, Receiver, Reply

RELAXED = ("--request-timeout", "2", "--lease", "9")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


def drain(database_url: str, *args: str) -> int:
    return main(
        [
            *("dispatch", "--database-url", database_url, "--drain"),
            *("--allow-private-networks", *RELAXED, *args),
        ]
    )


def test_the_started_event_says_how_it_runs_and_its_health_urls_answer(
    database_url: str, fleet: Fleet
) -> None:
    proc = fleet.start(database_url, *RELAXED, "--concurrency", "7", "--metrics-port", "0")

    def started() -> dict[str, Any] | None:
        return next((e for e in proc.events() if e["event"] == "started"), None)

    event = wait_until(started, timeout=30, what="the started event", processes=[proc])
    assert event["schema"] == "outbox"
    assert proc.owns(event["owner"])
    assert event["concurrency"] == 7
    assert event["wakeups"] == "listen"
    assert event["level"] == "info"
    # port 0 asked for a free port: the event names the one taken, and it answers
    assert event["livez"].startswith("http://127.0.0.1:")
    assert not event["livez"].startswith("http://127.0.0.1:0/")
    for name in ("metrics", "healthz", "livez"):
        assert event[name].endswith(f"/{name}")
        with urllib.request.urlopen(event[name], timeout=10) as response:
            assert response.status == 200, name
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == ExitCode.OK, proc.describe()


def test_the_started_event_in_text_says_it_polls_without_listen(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert drain(database_url, "--no-listen", "--log-format", "text") == ExitCode.OK
    (line,) = [line for line in capsys.readouterr().out.splitlines() if " started " in line]
    assert "INFO" in line and "schema=outbox" in line and "wakeups=poll" in line
    assert "livez" not in line  # no metrics server was asked for


def test_a_drain_exits_3_and_counts_the_dead_when_messages_went_dead(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def reply(request: Received) -> Reply:
        return Reply(status=400 if request.path == "/bad" else 200)

    with Receiver(reply) as receiver:
        enqueue_many(database_url, f"{receiver.url}/ok", ["fine-1"])
        assert drain(database_url, "--log-format", "json") == ExitCode.OK
        assert "stopped; delivered 1, retried 0, dead 0" in capsys.readouterr().err

        enqueue_many(database_url, f"{receiver.url}/ok", ["fine-2"])
        enqueue_many(database_url, f"{receiver.url}/bad", ["refused-1", "refused-2"])
        assert drain(database_url, "--log-format", "json") == ExitCode.DEAD_AFTER_DRAIN
    captured = capsys.readouterr()
    assert "delivered 1, retried 0, dead 2" in captured.err
    assert "2 message(s) went dead" in captured.err
    dead = [json.loads(line) for line in captured.out.splitlines() if '"dead"' in line]
    assert len([e for e in dead if e["event"] == "dead"]) == 2
