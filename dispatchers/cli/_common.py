"""What every command shares: the database, the secrets key, one transaction,
errors, argument types.

The database is ``--database-url``, else the environment's, else the embedded
server; variables are read through :mod:`dispatchers.environment`. The argument
types are the only ones on the command line: each bound is that of
:mod:`dispatchers.runtime.config`, so every time derived from an argument fits
PostgreSQL's timestamps and Python's datetimes; a rejected value is quoted.

The module stays whole: it is the one home of the argument types and of the
choice of database, which every command reads here and nowhere else.

Design: docs/explanation/design/cli.md
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeAlias, TypeVar

import psycopg

from dispatchers import environment
from dispatchers.cli._exit import ExitCode
from dispatchers.embedded import Database, configured_url, embedded_path, resolve
from dispatchers.environment import SECRETS_KEY_VARIABLE
from dispatchers.runtime.config import MAX_COUNT, MAX_NUMBER, MAX_SECONDS
from dispatchers.ui.policy_text import UNIT_SECONDS, format_duration
from outbox.defaults import DEFAULT_SCHEMA, MAX_RETRY_DELAY, MAX_RETRY_SCHEDULE, MAX_SPAN
from outbox.errors import InvalidArgument, OutboxError
from outbox.internal import MAX_ID
from outbox.sealing import Keyring

T = TypeVar("T")

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers()`` returns (argparse names its type privately): where a
command module adds its command, in its ``add_parser(commands)``."""

Handler = Callable[[argparse.Namespace], ExitCode]
"""What a command runs: parsed arguments in, exit status out."""

DISTRIBUTION = "pg-outbox"
"""The name this project is installed by (``pip install pg-outbox``); its import
packages are ``outbox`` and ``dispatchers``, its command ``outbox``."""

_EXTRA_MARKER = re.compile(r"""^\s*\(?\s*extra\s*==\s*['"]([\w.-]+)['"]\s*\)?\s*$""")


@functools.cache
def extra_distributions(extra: str) -> tuple[str, ...]:
    """The distributions the ``extra`` of the installed :data:`DISTRIBUTION`
    brings, as its metadata lists them (``pyproject.toml``'s optional dependencies,
    with the extras an extra includes spelled out by the build). A requirement that
    holds only on some platforms is left out; so is everything when the project is
    not installed as a distribution (the commands' imports then fail as Python
    says)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    names: list[str] = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        named = _EXTRA_MARKER.match(marker)
        if named is None or named.group(1) != extra:
            continue
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if name is not None and name.group(1) not in names:
            names.append(name.group(1))
    return tuple(names)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose every error is one line on stderr (exit status 2)
    naming the option at fault, as the commands' own errors are: argparse would
    print the command's usage first, a screenful for ``outbox dispatch``.
    Subcommands' parsers are of the same class (argparse makes them so)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class UsageError(OutboxError):
    """A command line that cannot be carried out as given (exit status 2)."""


class MissingExtra(Exception):
    """A command needs modules that an extra of the distribution installs.

    Not an :class:`OutboxError`: the command line is fine, the installation is not.
    """

    def __init__(self, extra: str) -> None:
        super().__init__(f"needs the {extra!r} extra: pip install '{DISTRIBUTION}[{extra}]'")
        self.extra = extra


def require_extra(extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtra` unless every distribution the ``extra`` brings is
    installed (:func:`extra_distributions`), or with ``modules``, unless each of them
    can be imported. Nothing is imported, so a command checks before its first heavy
    import and the check itself costs next to nothing.
    """
    if modules:
        if any(importlib.util.find_spec(name) is None for name in modules):
            raise MissingExtra(extra)
        return
    for name in extra_distributions(extra):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise MissingExtra(extra) from None


# -- the database ----------------------------------------------------------------


def add_database_options(
    parser: argparse.ArgumentParser, *, schema: bool = True, many: bool = False
) -> None:
    """``--database-url`` (repeatable with ``many``) and, unless a command picks its
    own schemas, ``--schema``."""
    parser.add_argument(
        "--database-url",
        metavar="URL",
        action="append" if many else "store",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, "
        "else the embedded server in ./.outbox/pg)"
        + ("; repeat it to serve several databases from this process" if many else ""),
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
    explicit = getattr(args, "database_url", None)
    if configured_url(explicit) is None:
        require_extra("embedded")
    db = resolve(explicit)
    if db.embedded:
        print(
            f"outbox: no database URL given; using the embedded PostgreSQL in "
            f"{embedded_path()} ({db.url})",
            file=sys.stderr,
        )
    return db


# -- the secrets key ----------------------------------------------------------------


def add_secrets_key_option(parser: argparse.ArgumentParser) -> None:
    """``--secrets-key-file``: the keys that seal and open signing secrets."""
    parser.add_argument(
        "--secrets-key-file",
        metavar="FILE",
        help="file listing the keys that seal signing secrets at rest (base64 of 32 bytes "
        "each, one per line; the first seals, every one opens; default: "
        f"${SECRETS_KEY_VARIABLE}, comma-separated)",
    )


MAX_KEY_FILE = 64 * 1024
"""The most a ``--secrets-key-file`` may hold: about a thousand keys."""


def read_small_file(path: str, field: str, *, limit: int, encoding: str = "utf-8") -> str:
    """The text of the regular file ``path``, at most ``limit`` bytes.

    Every file a command reads comes through here, so none can make it read
    forever (``/dev/zero``), wait on a writer (a FIFO) or fill memory: anything
    but a regular file, a file over ``limit`` bytes or one not in ``encoding`` is
    a :class:`UsageError` naming ``field`` (exit 2), and nothing is read past the
    limit. The file is opened without blocking and checked by its descriptor, so
    it is the file read that was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"{field}: cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{field}: {path} is not a regular file")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"{field}: cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise UsageError(f"{field}: {path} is larger than {limit:,} bytes")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        raise UsageError(f"{field}: {path} is not {encoding.upper()} text") from None


def keyring(args: argparse.Namespace) -> Keyring | None:
    """The keyring of ``--secrets-key-file``, else of ``OUTBOX_SECRETS_KEY``, else
    None. A file that cannot be read, or anything but keys in it (or in the
    variable), is refused naming the option (or the variable); a key without the
    ``encryption`` extra is :class:`MissingExtra`. Both exit 2."""
    path = getattr(args, "secrets_key_file", None)
    if path is not None:
        field = "--secrets-key-file"
        text = read_small_file(path, field, limit=MAX_KEY_FILE, encoding="ascii")
    else:
        field = SECRETS_KEY_VARIABLE
        text = environment.secrets_key() or ""
        if not text:
            return None
    require_extra("encryption")
    return Keyring.from_text(text, field)


@contextlib.contextmanager
def transaction(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """One transaction for one command: committed when the block ends, rolled
    back (nothing written) when it raises."""
    db = resolve_database(args)
    with psycopg.connect(db.url, connect_timeout=10) as conn:
        yield conn


@contextlib.contextmanager
def naming_options(options: Mapping[str, str]) -> Iterator[None]:
    """An argument the library refuses (:class:`~outbox.errors.InvalidArgument`,
    naming its field) is a usage error that names the option that gave it too,
    from ``options`` (field to option): ``metadata: ... (--metadata)``."""
    try:
        yield
    except InvalidArgument as exc:
        option = options.get(exc.field)
        if option is None:
            raise
        raise UsageError(f"{exc.field}: {exc.problem} ({option})") from None


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


def _quoted(text: str) -> str:
    """``text`` as an error message quotes it: in full up to 40 characters."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argument type: an integer from ``low`` to ``high`` (``20_000`` is
    accepted, as Python writes it)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{_quoted(text)} must be from {low} to {high}")
        return value

    return parse


def number(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """An argument type: a finite number from ``low`` (or, with ``above``, more than
    ``low``) to ``high``; ``inf`` and ``nan`` are refused, ``-0`` is 0."""
    rule = f"above {low:g}" if above else f"from {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text) + 0.0  # + 0.0 turns -0.0 into 0.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not a number") from None
        if not (low < value if above else low <= value) or not value <= high:
            raise argparse.ArgumentTypeError(
                f"{_quoted(text)} must be a finite number {rule} and at most {high:g}"
            )
        return value

    return parse


positive_int = integer(1, MAX_COUNT)
"""A count: an integer from 1 to :data:`~dispatchers.runtime.config.MAX_COUNT`."""

database_id = integer(1, MAX_ID)
"""The id of a row: an integer from 1 to PostgreSQL's largest ``bigint``."""

port = integer(0, 65535)
"""A TCP port; 0 lets the system choose."""

positive_float = number(0, MAX_NUMBER, above=True)
"""A number above 0, at most :data:`~dispatchers.runtime.config.MAX_NUMBER`."""

non_negative_float = number(0, MAX_NUMBER)
"""A number, 0 or more, at most :data:`~dispatchers.runtime.config.MAX_NUMBER`."""

fraction = number(0, 1)
"""A number from 0 to 1, both included."""

ratio = number(0, 1, above=True)
"""A share: a number above 0, at most 1."""

seconds = number(0, MAX_SECONDS, above=True)
"""A time in seconds, above 0, at most :data:`~dispatchers.runtime.config.MAX_SECONDS`."""

seconds_or_zero = number(0, MAX_SECONDS)
"""A time in seconds, 0 or more, at most :data:`~dispatchers.runtime.config.MAX_SECONDS`."""

hours = number(0, MAX_SPAN / 3600)
"""A time in hours, 0 or more, at most :data:`~outbox.defaults.MAX_SPAN`."""


def list_of(parse: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """An argument type: a comma-separated list of what ``parse`` accepts, each once."""

    def parse_list(text: str) -> tuple[T, ...]:
        items = tuple(parse(part.strip()) for part in text.split(","))
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{_quoted(text)} names a value twice")
        return items

    return parse_list


# -- spans and times ---------------------------------------------------------------

_SPAN = re.compile(r"^(\d{1,9})([smhdw])\Z")


def _span(text: str) -> int | None:
    """Seconds of a span such as ``30m`` or ``7d``, or None if ``text`` is not one.
    Refuses a span longer than :data:`~outbox.defaults.MAX_SPAN`."""
    match = _SPAN.match(text.strip())
    if not match:
        return None
    value = int(match[1]) * UNIT_SECONDS[match[2]]
    if value > MAX_SPAN:
        raise argparse.ArgumentTypeError(
            f"{_quoted(text)} is longer than {format_duration(MAX_SPAN)}"
        )
    return value


def parse_duration(text: str) -> float:
    """Seconds from a span such as ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``, up to
    :data:`~outbox.defaults.MAX_SPAN`."""
    value = _span(text)
    if not value:
        raise argparse.ArgumentTypeError(
            f"{_quoted(text)} is not a positive span like 30m, 12h or 7d (units s, m, h, d, w)"
        )
    return float(value)


def retry_schedule(text: str) -> tuple[float, ...]:
    """Delays before each retry, comma-separated spans such as ``5s,1m,10m,1h``:
    at most :data:`~outbox.defaults.MAX_RETRY_SCHEDULE` of them, each at most
    :data:`~outbox.defaults.MAX_RETRY_DELAY` (the rule :class:`outbox.Endpoints`
    and :class:`outbox.EventTypes` enforce)."""
    parts = text.split(",")
    if len(parts) > MAX_RETRY_SCHEDULE:
        raise argparse.ArgumentTypeError(
            f"{_quoted(text)} lists more than {MAX_RETRY_SCHEDULE} delays"
        )
    delays = tuple(parse_duration(part) for part in parts)
    if max(delays) > MAX_RETRY_DELAY:
        raise argparse.ArgumentTypeError(
            f"{_quoted(text)} has a delay longer than {format_duration(MAX_RETRY_DELAY)}"
        )
    return delays


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """An aware datetime from ISO 8601 with an offset or ``Z``, or from a span
    ago such as ``30m``, ``2h``, ``7d`` (units s, m, h, d, w; at most
    :data:`~outbox.defaults.MAX_SPAN`)."""
    span = _span(text)
    if span is not None:
        return (now or datetime.now(UTC)) - timedelta(seconds=span)
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{_quoted(text)} is neither an ISO 8601 time (2024-05-01T12:00:00Z) nor a span "
            "ago like 30m, 2h or 7d"
        ) from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{_quoted(text)} has no UTC offset: add one (+02:00) or Z, so it means one instant"
        )
    return value
