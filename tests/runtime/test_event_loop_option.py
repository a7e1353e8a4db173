"""``outbox dispatch --event-loop``: the dispatcher (and each child of
``--processes``) runs on the loop asked for, and says which in its ``started``
event; uvloop asked for but missing stops the command before anything is sent."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main
from outbox import Outbox
from tests.receiver import Receiver


def enqueue(url: str, target: str, *keys: str) -> None:
    with psycopg.connect(url) as conn:
        for key in keys:
            Outbox().enqueue(conn, url=target, idempotency_key=key, json={"key": key})


def events(stdout: str, name: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r for r in records if r["event"] == name]


def dispatch(url: str, *args: str) -> int:
    return main(
        [
            *("dispatch", "--database-url", url, "--drain", "--allow-private-networks"),
            *("--request-timeout", "2", "--lease", "9", "--log-format", "json", *args),
        ]
    )


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
@pytest.mark.slow
def test_dispatch_runs_and_delivers_on_the_loop_asked_for(
    database_url: str, capsys: pytest.CaptureFixture[str], event_loop: str
) -> None:
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    with Receiver() as receiver:
        enqueue(database_url, receiver.url, f"loop-{event_loop}")
        assert dispatch(database_url, "--event-loop", event_loop) == 0
    out = capsys.readouterr().out
    (started,) = events(out, "started")
    assert started["event_loop"] == event_loop
    assert [r.headers["idempotency-key"] for r in receiver.requests] == [f'"loop-{event_loop}"']


def test_uvloop_asked_for_but_missing_exits_2_and_sends_nothing(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a machine without it
    with Receiver() as receiver:
        enqueue(database_url, receiver.url, "loop-missing")
        assert dispatch(database_url, "--event-loop", "uvloop") == 2
    captured = capsys.readouterr()
    assert "event_loop: 'uvloop' was asked for but cannot be imported" in captured.err
    assert "pg-outbox[fast]" in captured.err
    assert events(captured.out, "started") == []
    assert receiver.requests == []


def test_an_unknown_event_loop_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["dispatch", "--event-loop", "trio"])
    assert info.value.code == 2
    assert "--event-loop" in capsys.readouterr().err


@pytest.mark.slow
def test_every_child_of_processes_runs_on_the_loop_asked_for(database_url: str) -> None:
    # asyncio, not the default (uvloop where installed): the choice must reach them
    with Receiver() as receiver:
        enqueue(database_url, receiver.url, *(f"children-{i}" for i in range(20)))
        result = subprocess.run(
            [
                *(sys.executable, "-m", "dispatchers.cli", "dispatch"),
                *("--database-url", database_url, "--processes", "2", "--drain"),
                *("--event-loop", "asyncio", "--allow-private-networks", "--log-format", "json"),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    started = events(result.stdout, "started")
    assert [e["event_loop"] for e in started] == ["asyncio", "asyncio"]
    assert len({r.headers["idempotency-key"] for r in receiver.requests}) == 20
