"""What ``outbox dispatch`` tells its operator: at the end of a drain, a summary
and an exit status that tell a clean drain from one in which messages went
dead."""

from __future__ import annotations

import json

import pytest

from dispatchers.cli import main
from dispatchers.cli._exit import ExitCode
from tests.processes import enqueue_many
from tests.receiver import Received, Receiver, Reply

RELAXED = ("--request-timeout", "2", "--lease", "9")


def drain(database_url: str, *args: str) -> int:
    return main(
        [
            *("dispatch", "--database-url", database_url, "--drain"),
            *("--allow-private-networks", *RELAXED, *args),
        ]
    )


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
