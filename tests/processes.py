"""Helpers for tests that run real ``outbox dispatch`` processes.

Every wait here is bounded: processes are waited for with a timeout, the database is
polled with a deadline, and :class:`Fleet` kills whatever is still running when a
test ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import psycopg

from outbox import Outbox

T = TypeVar("T")

DISPATCH = (sys.executable, "-m", "dispatchers.cli", "dispatch")


class DispatcherProcess:
    """One ``outbox dispatch`` subprocess; stdout and stderr go to files."""

    def __init__(self, database_url: str, args: Sequence[str], workdir: Path, name: str) -> None:
        self.name = name
        self.stdout_path = workdir / f"{name}.stdout"
        self.stderr_path = workdir / f"{name}.stderr"
        self.argv = [
            *DISPATCH,
            "--database-url",
            database_url,
            "--allow-private-networks",
            "--log-format",
            "json",
            *args,
        ]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OUTBOX_DATABASE_URL", "DATABASE_URL", "OUTBOX_EMBEDDED_DIR")
        }
        env["PYTHONUNBUFFERED"] = "1"
        env["PGAPPNAME"] = name  # its sessions, as pg_stat_activity shows them
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # cwd is the test's own directory, so nothing can ever land in the repository.
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir, env=env
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def owner_prefix(self) -> str:
        """The start of this process's lease owner id (``host:pid:random``)."""
        return f"{socket.gethostname()}:{self.pid}:"

    def owns(self, owner: str | None) -> bool:
        return owner is not None and owner.startswith(self.owner_prefix)

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (with the process's stderr) after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} (pid {self.pid}) still running after {timeout:g} s\n"
                f"stderr tail:\n{self.stderr()[-2000:]}"
            ) from None

    def kill(self) -> None:
        if self.running():
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as a JSON object (a line that is not one fails)."""
        events: list[dict[str, Any]] = []
        for number, line in enumerate(self.stdout().splitlines(), 1):
            try:
                record = json.loads(line)
            except ValueError:
                raise AssertionError(
                    f"{self.name} stdout line {number} is not JSON: {line!r}"
                ) from None
            if not isinstance(record, dict):
                raise AssertionError(f"{self.name} stdout line {number} is not an object: {line!r}")
            events.append(record)
        return events

    def describe(self) -> str:
        """Exit state and output tails, for assertion messages."""
        return (
            f"{self.name} pid={self.pid} rc={self.popen.poll()}\n"
            f"stderr tail:\n{self.stderr()[-2000:]}\nstdout tail:\n{self.stdout()[-2000:]}"
        )


class Fleet:
    """Starts dispatcher processes for one test and kills the leftovers at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[DispatcherProcess] = []

    def start(self, database_url: str, *args: str) -> DispatcherProcess:
        name = f"dispatcher-{len(self.processes) + 1}"
        process = DispatcherProcess(database_url, args, self.workdir, name)
        self.processes.append(process)
        return process

    def kill_all(self) -> None:
        for process in self.processes:
            process.kill()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill_all()


def terminate(process: DispatcherProcess) -> float:
    """Send SIGTERM; return the monotonic time just before it was sent."""
    at = time.monotonic()
    process.signal(signal.SIGTERM)
    return at


# -- database -----------------------------------------------------------------


def query(url: str, statement: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
    """Run one statement on a fresh autocommit connection and return its rows."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(statement, params)  # type: ignore[arg-type]
        return list(cur.fetchall()) if cur.description else []


def scalar(url: str, statement: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
    return query(url, statement, params)[0][0]


def sessions(url: str, process: DispatcherProcess) -> list[tuple[str, Any]]:
    """(state, state_change) of each server session ``process`` has open, sorted."""
    rows = query(
        url,
        "SELECT state, state_change FROM pg_stat_activity"
        " WHERE application_name = %s AND datname = current_database()",
        (process.name,),
    )
    return sorted(rows, key=repr)


def wait_until(
    probe: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    processes: Iterable[DispatcherProcess] = (),
) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds.

    Database connection errors count as "not yet" (the server may be restarting).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except psycopg.OperationalError as exc:
            last = exc
        if time.monotonic() >= deadline:
            details = "\n".join(p.describe() for p in processes)
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {last!r}\n{details}"
            )
        time.sleep(interval)


def enqueue_many(
    url: str,
    target: str,
    keys: Sequence[str],
    *,
    per_transaction: int = 2500,
    headers: dict[str, str] | None = None,
    body: str | None = None,
) -> list[int]:
    """Enqueue one POST to ``target`` per key with ``Outbox().enqueue``, in a few
    transactions; return the message ids in key order."""
    box = Outbox()
    ids: list[int] = []
    with psycopg.connect(url) as conn:
        for start in range(0, len(keys), per_transaction):
            with conn.transaction():
                for key in keys[start : start + per_transaction]:
                    if body is None:
                        ids.append(
                            box.enqueue(conn, url=target, idempotency_key=key, json={"key": key})
                        )
                    else:
                        ids.append(
                            box.enqueue(
                                conn, url=target, idempotency_key=key, body=body, headers=headers
                            )
                        )
    return ids


def structured_key(key: str) -> str:
    """The ``Idempotency-Key`` header value the dispatcher sends by default."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
