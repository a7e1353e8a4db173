"""`outbox dispatch --processes N` shares the work among N processes and stops them
all on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from dispatchers.runtime.supervisor import child_argv
from outbox import Outbox
from tests.receiver import Receiver, Reply


def test_child_arguments_drop_processes_and_pin_the_database() -> None:
    argv = [
        "dispatch",
        "--processes",
        "3",
        "--database-url",
        "postgresql:///a",
        "--concurrency=8",
        "--processes=2",
        "--drain",
    ]
    assert child_argv(argv, "postgresql:///b") == [
        "dispatch",
        "--concurrency=8",
        "--drain",
        "--database-url",
        "postgresql:///b",
    ]


@pytest.mark.slow
def test_processes_drain_the_backlog_together(database_url: str) -> None:
    # Slow answers and few requests in flight per process, so that one process
    # cannot drain the backlog alone before the others have started.
    with Receiver(lambda req: Reply(delay=0.02)) as receiver:
        with psycopg.connect(database_url) as conn:
            for i in range(300):
                Outbox().enqueue(conn, url=receiver.url, idempotency_key=f"p-{i}", json={})
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "dispatchers.cli",
                "dispatch",
                "--database-url",
                database_url,
                "--processes",
                "3",
                "--concurrency",
                "4",
                "--drain",
                "--allow-private-networks",
                "--log-format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT count(*), count(DISTINCT owner) FROM outbox.attempts"
        ).fetchone()
    assert rows is not None
    delivered, distinct_owners = rows
    assert delivered == 300
    assert distinct_owners >= 2  # the work was shared, not done by one process
    assert len({r.headers["idempotency-key"] for r in receiver.requests}) == 300


@pytest.mark.slow
def test_sigterm_stops_every_child(database_url: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dispatchers.cli",
            "dispatch",
            "--database-url",
            database_url,
            "--processes",
            "2",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with psycopg.connect(database_url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = ''"
                    " AND datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
            if row and row[0] >= 4:  # both children connected (pool + listener)
                break
            assert time.monotonic() < deadline, f"children not connected in 30 s: {row}"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (the SigCgt
    mask of /proc/PID/status: bit n - 1 for signal n)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigCgt line for pid {pid}")


@pytest.mark.slow
def test_sigterm_while_the_children_start_is_a_clean_stop(database_url: str) -> None:
    # Children still importing have no signal handler yet: SIGTERM ends them at
    # once, before they claim anything, and the fleet stops with 0 all the same.
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "dispatchers.cli", "dispatch"),
            *("--database-url", database_url, "--processes", "2", "--log-format", "json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(children_of(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(children_of(proc.pid)) == 2
        # the supervisor installs its handlers before it starts the children
        while not catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert catches(proc.pid, signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def dispatchers_of(database_url: str) -> list[int]:
    """The pids of every ``outbox dispatch`` process on ``database_url``, wherever
    its parent went."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if b"dispatchers.cli" in argv and database_url.encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def test_sigterm_while_the_supervisor_starts_its_children_leaves_none_behind(
    database_url: str,
) -> None:
    # Eight children take the supervisor a while to start: a SIGTERM sent as the
    # first appears reaches every child started, and no more start.
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "dispatchers.cli", "dispatch"),
            *("--database-url", database_url, "--processes", "8", "--log-format", "json"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")  # read in one go
    try:
        deadline = time.monotonic() + 30
        while not started.read_text() and time.monotonic() < deadline:
            pass  # no pause: the signal must come while the others are starting
        assert started.read_text(), "no child started within 30 s"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert dispatchers_of(database_url) == []
    finally:
        for pid in dispatchers_of(database_url):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_children_of_a_process_serving_several_databases_get_them_as_given() -> None:
    argv = ["dispatch", "--database-url", "a", "--processes=2", "--databases", "f.toml"]
    assert child_argv(argv, None) == ["dispatch", "--database-url", "a", "--databases", "f.toml"]
