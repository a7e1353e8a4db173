"""A throwaway PgBouncer in transaction mode, in front of the test's PostgreSQL.

:func:`start_pgbouncer` writes an ini file and a user list in a private directory,
starts ``pgbouncer`` on 127.0.0.1 at a free port and waits (bounded) until it
accepts connections. PgBouncer refuses to run as root, so as root it runs as the
owner of the server's socket directory (the ``pgserver`` user that the embedded
server runs as) or else ``nobody``, through ``setpriv``. :meth:`PgBouncer.stop`
terminates it (SIGKILL after a few seconds) and removes its directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg

START_TIMEOUT = 15.0


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` executable (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def pgbouncer_version(binary: str) -> tuple[int, ...]:
    """``(1, 18, 0)`` from ``pgbouncer --version`` (``PgBouncer 1.18.0`` first)."""
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    match = re.search(r"PgBouncer\s+(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise RuntimeError(f"cannot read the PgBouncer version from {out!r}")
    return tuple(int(part or 0) for part in match.groups())


@dataclass(frozen=True)
class Upstream:
    """Where PgBouncer connects: host (a socket directory or a name), port, and
    the database and credentials of the test's URL."""

    host: str
    port: int
    database: str
    user: str
    password: str

    @classmethod
    def from_url(cls, url: str) -> Upstream:
        parts = urlsplit(url)
        host = parse_qs(parts.query).get("host", [parts.hostname or "/var/run/postgresql"])[0]
        return cls(
            host=host,
            port=parts.port or 5432,
            database=unquote(parts.path.lstrip("/")) or "postgres",
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or ""),
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run_as(upstream: Upstream) -> pwd.struct_passwd | None:
    """The unprivileged user to run as, or None when not root."""
    if os.geteuid() != 0:
        return None
    if upstream.host.startswith("/"):
        with contextlib.suppress(OSError, KeyError):
            owner = pwd.getpwuid(os.stat(upstream.host).st_uid)
            if owner.pw_uid != 0:
                return owner
    return pwd.getpwnam("nobody")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class PgBouncer:
    """A running PgBouncer; ``url`` connects to the test database through it."""

    def __init__(
        self,
        binary: str,
        upstream: Upstream,
        *,
        pool_size: int,
        max_prepared_statements: int | None,
    ) -> None:
        self.upstream = upstream
        self.version = pgbouncer_version(binary)
        self.user = _run_as(upstream)
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-"))
        self.port = _free_port()
        self.log = self.dir / "pgbouncer.log"
        ini = self.dir / "pgbouncer.ini"
        server = (
            f"host={upstream.host} port={upstream.port} dbname={upstream.database}"
            f" user={upstream.user}"
            + (f" password={_quote(upstream.password)}" if upstream.password else "")
        )
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.dir / "userlist.txt"),
            "pool_mode": "transaction",
            "default_pool_size": str(pool_size),
            "max_client_conn": "200",
            "ignore_startup_parameters": "extra_float_digits",
            "logfile": str(self.log),
            "pidfile": str(self.dir / "pgbouncer.pid"),
            "admin_users": upstream.user,
        }
        if max_prepared_statements is not None:
            settings["max_prepared_statements"] = str(max_prepared_statements)
        ini.write_text(
            "[databases]\n"
            f"{upstream.database} = {server}\n\n"
            "[pgbouncer]\n" + "".join(f"{key} = {value}\n" for key, value in settings.items()),
            encoding="utf-8",
        )
        (self.dir / "userlist.txt").write_text(f'"{upstream.user}" ""\n', encoding="utf-8")
        argv = [binary, str(ini)]
        if self.user is not None:
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
            setpriv = shutil.which("setpriv")
            if setpriv:
                argv = [
                    setpriv,
                    f"--reuid={self.user.pw_uid}",
                    f"--regid={self.user.pw_gid}",
                    "--clear-groups",
                    *argv,
                ]
            else:  # PgBouncer drops root itself
                argv = [binary, "-u", self.user.pw_name, str(ini)]
        with open(self.dir / "stderr", "wb") as stderr:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=self.dir,
            )

    @property
    def url(self) -> str:
        """The test database through PgBouncer (PgBouncer itself trusts the client)."""
        return f"postgresql://{self.upstream.user}@127.0.0.1:{self.port}/{self.upstream.database}"

    def describe(self) -> str:
        logs = []
        for name in ("pgbouncer.log", "stderr"):
            with contextlib.suppress(OSError):
                logs.append((self.dir / name).read_text(errors="replace")[-3000:])
        return f"pgbouncer {self.version} rc={self.process.poll()}\n" + "\n".join(logs)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until a query goes through it (bounded); fail with its log otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start\n{self.describe()}")
            try:
                with psycopg.connect(
                    self.url, autocommit=True, connect_timeout=2, prepare_threshold=None
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer not ready after {timeout:g} s\n{self.describe()}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_pgbouncer(
    binary: str, database_url: str, *, pool_size: int = 4, max_prepared_statements: int | None
) -> PgBouncer:
    """Start PgBouncer in front of ``database_url``'s database; ready when it returns.

    A port taken between choosing and binding it is retried with another.
    """
    upstream = Upstream.from_url(database_url)
    attempts = 3
    while True:
        attempts -= 1
        bouncer = PgBouncer(
            binary, upstream, pool_size=pool_size, max_prepared_statements=max_prepared_statements
        )
        try:
            bouncer.wait_ready()
        except RuntimeError:
            bouncer.stop()
            if not attempts:
                raise
        else:
            return bouncer
