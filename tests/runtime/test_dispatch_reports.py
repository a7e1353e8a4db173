"""What ``outbox dispatch`` tells its operator: a ``started`` event once it is
ready (how it runs, where its health endpoints are), and at the end of a drain a
summary and an exit status that tell a clean drain from one in which messages
went dead."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dispatchers.cli import main
from dispatchers.cli._exit import ExitCode
from tests.processes import Fleet, enqueue_many, query, wait_until
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


@pytest.mark.parametrize("drain", [False, True], ids=["run", "drain"])
def test_a_metrics_port_in_use_ends_the_start_in_one_line(
    database_url: str, fleet: Fleet, drain: bool
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = [*RELAXED, "--metrics-port", str(port), *(["--drain"] if drain else [])]
        proc = fleet.start(database_url, *args)
        assert proc.wait(timeout=60) == ExitCode.FAILURE, proc.describe()
    lines = proc.stderr().strip().splitlines()
    assert lines == [
        f"outbox dispatch: cannot serve metrics on 127.0.0.1 port {port}: Address already in use"
    ], proc.describe()
    assert not [e for e in proc.events() if e["event"] == "started"]
    # it failed before connecting: no session of it was left on the server
    assert not query(
        database_url,
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
        (proc.name,),
    )


def _below_ephemeral() -> range:
    """Ports below the kernel's ephemeral range: none is handed to an outgoing
    connection (a database's, an HTTP client's) between a probe and its use."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10_000, max(low, 10_100))


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 free just now, taken
    below the ephemeral range, so that only a listener could take them meanwhile."""
    candidates = _below_ephemeral()
    for _ in range(50):
        first = random.choice(candidates[: len(candidates) - count])
        with contextlib.ExitStack() as stack:
            try:
                for port in range(first, first + count):
                    taken = stack.enter_context(socket.socket())
                    taken.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise AssertionError(f"no {count} consecutive free ports in 50 tries")


@pytest.mark.slow
def test_each_process_serves_its_metrics_on_a_port_of_its_own(
    database_url: str, fleet: Fleet
) -> None:
    first = free_ports(2)
    proc = fleet.start(database_url, *RELAXED, "--processes", "2", "--metrics-port", str(first))

    def answering() -> bool:
        for port in (first, first + 1):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as r:
                    assert r.status == 200
            except OSError:
                return False
        return True

    wait_until(answering, timeout=60, what="both children's /livez", processes=[proc])
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == ExitCode.OK, proc.describe()


class HeldDoor:
    """A TCP door to the test's database that lets the first connection in, tells
    when it has, and relays its bytes only once :meth:`open` is called: a client
    held at its first connection, for as long as a test needs. Threads, bounded."""

    def __init__(self, database_url: str) -> None:
        info = conninfo_to_dict(database_url)
        host, port = str(info.get("host") or "/tmp"), int(info.get("port") or 5432)
        self.upstream: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = make_conninfo(database_url, host="127.0.0.1", port=self.port)
        self.knocked = threading.Event()
        self._open = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._serve, daemon=True)]
        self._threads[0].start()

    def _serve(self) -> None:
        self.listener.settimeout(60)
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        self._sockets.append(client)
        self.knocked.set()
        self._open.wait(60)
        server = socket.socket(self.upstream[0])
        self._sockets.append(server)
        server.connect(self.upstream[1])
        for source, sink in ((client, server), (server, client)):
            pump = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
            self._threads.append(pump)
            pump.start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(60)
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
        self.listener.close()
        for thread in self._threads:
            thread.join(10)
        for sock in self._sockets:
            sock.close()


def test_sigterm_while_a_dispatcher_starts_stops_it_cleanly_before_it_claims(
    database_url: str, fleet: Fleet
) -> None:
    enqueue_many(database_url, "http://127.0.0.1:9/never", ["waits"])
    door = HeldDoor(database_url)
    try:
        proc = fleet.start(door.url, *RELAXED, "--drain")
        # it is checking the database, its handlers not yet those of the loop
        assert door.knocked.wait(60), proc.describe()
        proc.signal(signal.SIGTERM)
        door.open()
        assert proc.wait(timeout=60) == ExitCode.OK, proc.describe()
    finally:
        door.close()
    assert "stopped before it started" in proc.stderr(), proc.describe()
    assert query(database_url, "SELECT state, attempts FROM outbox.messages") == [("ready", 0)]
