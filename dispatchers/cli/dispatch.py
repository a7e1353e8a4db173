"""``outbox dispatch``: run a dispatcher process, or several on this host.

The options that set a :class:`~dispatchers.runtime.config.DispatcherConfig` field are
made from the field: its default, and the help and shape in its metadata
(:class:`~dispatchers.runtime.config.Option`). The other options take their defaults from
where those are defined too (the retry policy's from
:class:`~dispatchers.delivery.retry.ExponentialBackoff`, the log's from
:class:`~dispatchers.runtime.log.EventLog`), so no default is written twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dispatchers import environment
from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    add_secrets_key_option,
    integer,
    keyring,
    parse_duration,
    port,
    positive_int,
    ratio,
    read_small_file,
    require_extra,
    resolve_database,
    seconds,
    seconds_or_zero,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.delivery.proxy import Proxy
from dispatchers.delivery.retry import ExponentialBackoff
from dispatchers.environment import PROXY_VARIABLE
from dispatchers.runtime.config import LOOPBACK_NETWORKS, DispatcherConfig, Option, Values
from dispatchers.runtime.databases import Served, parse_databases, served
from dispatchers.runtime.log import LEVELS, EventLog
from dispatchers.ui.policy_text import format_duration
from outbox.errors import ConfigurationError

"""The environment variable that names the proxy when ``--proxy`` does not."""


def proxy(text: str) -> Proxy:
    """A ``--proxy`` argument (its credentials masked in the error)."""
    try:
        return Proxy.parse(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("proxy: ")) from None


_TYPES: dict[Values, Callable[[str], Any]] = {
    "count": positive_int,
    "seconds": seconds,
    "seconds_or_zero": seconds_or_zero,
    "span": parse_duration,
    "port": port,
    "proxy": proxy,
    "ratio": ratio,
    "text": str,
}
"""The argument type of each kind of :class:`~dispatchers.runtime.config.Option` value."""


def _options() -> Iterator[tuple[dataclasses.Field[Any], Option]]:
    """The fields of :class:`DispatcherConfig` offered as options, with their
    :class:`Option`."""
    for f in dataclasses.fields(DispatcherConfig):
        if (opt := f.metadata.get("option")) is not None:
            yield f, opt


def _shown(default: object, values: Values) -> str:
    """A default as the help text shows it."""
    if default is None:
        return "off"
    if values == "span" and isinstance(default, int | float):
        return format_duration(default)
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def add_config_options(parser: argparse._ActionsContainer) -> None:
    """One option per :class:`DispatcherConfig` field that has an :class:`Option`,
    its default the field's (booleans and tuples show none: the flag says it)."""
    for f, opt in _options():
        flag = opt.flag or "--" + f.name.replace("_", "-")
        text = opt.help.replace("%", "%%")  # argparse formats help with %
        if isinstance(f.default, bool):
            if f.default:
                flag = "--no-" + flag.removeprefix("--")
            action = "store_false" if f.default else "store_true"
            parser.add_argument(flag, dest=f.name, action=action, help=text)
        elif isinstance(f.default, tuple):
            parser.add_argument(
                flag,
                dest=f.name,
                action="append",
                default=list(f.default),
                metavar=opt.metavar,
                help=text,
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                type=_TYPES[opt.values],
                default=f.default,
                metavar=opt.metavar,
                choices=opt.choices,
                help=f"{text} (default: {opt.default or _shown(f.default, opt.values)})",
            )


MAX_PROCESSES = 256
"""The most ``--processes`` starts: one per core of a large host, with room to spare."""


def config_from_args(args: argparse.Namespace) -> DispatcherConfig:
    """The :class:`DispatcherConfig` named by parsed ``outbox dispatch`` options."""
    values = {f.name: getattr(args, f.name) for f, _ in _options()}
    values["allow_networks"] = tuple(values["allow_networks"])
    values["connect_timeout"] = min(args.connect_timeout, args.request_timeout)
    if values["proxy"] is None and (named := environment.proxy()):
        try:
            values["proxy"] = Proxy.parse(named)
        except ConfigurationError as exc:
            raise UsageError(f"{PROXY_VARIABLE}: {exc}") from None
    return DispatcherConfig(
        schema=args.schema,
        retry_policy=ExponentialBackoff(base=args.retry_base, cap=args.retry_cap),
        keyring=keyring(args),
        **values,
    )


def cmd_dispatch(args: argparse.Namespace) -> ExitCode:
    """Check the database, then dispatch (or supervise ``--processes``); a database
    the dispatcher cannot use, or a failure that stops it, is one line on stderr
    and :attr:`ExitCode.FAILURE`; a drain during which messages went dead ends
    with :attr:`ExitCode.DEAD_AFTER_DRAIN`."""
    # SIGTERM while starting (imports, the embedded server, the checks) is noted
    # and honoured once the dispatcher runs: it stops before claiming anything
    # and exits 0, as a SIGTERM later would, rather than 143.
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    require_extra("dispatcher")
    from dispatchers.errors import DispatcherFailed
    from dispatchers.runtime.dispatcher import run_dispatcher
    from dispatchers.runtime.loop import resolve as resolve_event_loop
    from dispatchers.store.preflight import check_database

    config = config_from_args(args)
    urls: list[str] = args.database_url or []
    if len(urls) > 1 or args.databases is not None:
        return _dispatch_many(args, config, urls, terminated)
    args.database_url = urls[0] if urls else None
    if config.metrics_port and config.metrics_port + args.processes - 1 > 65535:
        raise UsageError(
            f"--metrics-port: {args.processes} processes serve on ports {config.metrics_port}"
            f" to {config.metrics_port + args.processes - 1}, past 65535"
        )
    log = EventLog(format=args.log_format, level=args.log_level)
    log.capture_logging()
    resolve_event_loop(config.event_loop)  # a missing uvloop fails here, once, not per child
    db = resolve_database(args)
    argv = args.argv
    if db.embedded:
        # No URL given: the embedded server is a development database by
        # definition, so a receiver on this machine is allowed (loopback only;
        # the started event says so). A URL, even one to localhost, never is.
        config = dataclasses.replace(config, embedded_database=True)
        argv = [*argv, *(f"--allow-network={net}" for net in LOOPBACK_NETWORKS)]
    try:
        check_database(db.url, config)
        if terminated:
            print("outbox dispatch: stopped before it started", file=sys.stderr)
            return ExitCode.OK
        if args.processes > 1:
            from dispatchers.runtime.supervisor import supervise

            status = supervise(
                argv,
                db.url,
                args.processes,
                drain=args.drain,
                metrics_port=config.metrics_port,
            )
            return ExitCode.of_child(status)
        stats = run_dispatcher(
            db.url, config, drain=args.drain, log=log, stopped=lambda: bool(terminated)
        )
    except DispatcherFailed as exc:
        print(f"outbox dispatch: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    summary = (
        f"delivered {stats.delivered}, retried {stats.retried}, dead {stats.dead}, "
        f"released {stats.released}, leases lost {stats.lease_lost}"
    )
    if args.drain and stats.dead:
        print(
            f"outbox dispatch: stopped; {summary}: {stats.dead} message(s) went dead "
            "during the drain (outbox dead list shows them)",
            file=sys.stderr,
        )
        return ExitCode.DEAD_AFTER_DRAIN
    print(f"outbox dispatch: stopped; {summary}", file=sys.stderr)
    return ExitCode.OK


MAX_DATABASES_FILE = 1024 * 1024
"""The most a ``--databases`` file may hold (a few thousand entries)."""


def _dispatch_many(
    args: argparse.Namespace, config: DispatcherConfig, urls: Sequence[str], terminated: list[int]
) -> ExitCode:
    """``outbox dispatch`` for several databases: every entry checked before
    anything connects; then every database's start-up check, at once. A database
    that answers and cannot be used (not migrated, lacking a privilege or a key)
    fails the start, as it would alone; one that cannot be reached is left to its
    dispatcher, which keeps trying, unless none can be."""
    from dispatchers.errors import DatabaseUnreachable, DispatcherFailed
    from dispatchers.runtime.budget import Budget
    from dispatchers.runtime.fleet import run_fleet

    entries: list[Served] = []
    if args.databases is not None:
        text = read_small_file(args.databases, "--databases", limit=MAX_DATABASES_FILE)
        entries = parse_databases(text, source=f"--databases {args.databases}", schema=args.schema)
    databases = served(urls, args.schema, entries)
    Budget(config.concurrency, len(databases))  # each database needs a request slot
    if config.metrics_port and config.metrics_port + args.processes - 1 > 65535:
        raise UsageError(f"--metrics-port: {args.processes} processes run past port 65535")
    log = EventLog(format=args.log_format, level=args.log_level)
    log.capture_logging()
    from dispatchers.runtime.loop import resolve as resolve_event_loop

    resolve_event_loop(config.event_loop)
    problems = _check_databases(databases, config)
    unusable = {db.label: e for db, e in problems if not isinstance(e, DatabaseUnreachable)}
    for label, problem in unusable.items():
        print(f"outbox dispatch: {label}: {problem}", file=sys.stderr)
    if unusable:
        return ExitCode.FAILURE
    for db, problem in problems:
        tail = "" if len(problems) == len(databases) else "; serving the others, trying it again"
        print(f"outbox dispatch: {db.label}: {problem}{tail}", file=sys.stderr)
    if len(problems) == len(databases):
        return ExitCode.FAILURE
    if terminated:
        print("outbox dispatch: stopped before it started", file=sys.stderr)
        return ExitCode.OK
    try:
        if args.processes > 1:
            from dispatchers.runtime.supervisor import supervise

            status = supervise(
                args.argv, None, args.processes, drain=args.drain, metrics_port=config.metrics_port
            )
            return ExitCode.of_child(status)
        stats = run_fleet(
            databases, config, drain=args.drain, log=log, stopped=lambda: bool(terminated)
        )
    except DispatcherFailed as exc:
        print(f"outbox dispatch: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    dead = 0
    for label, counts in stats.items():
        dead += counts.dead
        print(
            f"outbox dispatch: stopped; {label}: delivered {counts.delivered}, retried "
            f"{counts.retried}, dead {counts.dead}, released {counts.released}, leases lost "
            f"{counts.lease_lost}",
            file=sys.stderr,
        )
    if args.drain and dead:
        print(
            f"outbox dispatch: {dead} message(s) went dead during the drain "
            "(outbox dead list --database-url ... shows them)",
            file=sys.stderr,
        )
        return ExitCode.DEAD_AFTER_DRAIN
    return ExitCode.OK


def _check_databases(
    databases: Sequence[Served], config: DispatcherConfig
) -> list[tuple[Served, Exception]]:
    """Each database's start-up check, all at once; the databases that failed it,
    with why."""
    from dispatchers.errors import DispatcherFailed
    from dispatchers.store.preflight import check_database

    def check(db: Served) -> DispatcherFailed | None:
        try:
            check_database(db.url, dataclasses.replace(config, schema=db.schema))
        except DispatcherFailed as exc:
            return exc
        return None

    with ThreadPoolExecutor(max_workers=min(16, len(databases))) as pool:
        outcomes = list(pool.map(check, databases))
    return [(db, e) for db, e in zip(databases, outcomes, strict=True) if e is not None]


def _default(function: Callable[..., object], parameter: str) -> Any:
    return inspect.signature(function).parameters[parameter].default


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "dispatch",
        help="run a dispatcher: claim ready messages and deliver them over HTTP",
        description="Run a dispatcher process. Run more copies (on any hosts) to scale "
        "out; each claims with leases, so no two deliver the same message at once. "
        "SIGTERM or SIGINT stops claiming at once and gives in-flight deliveries "
        "--grace seconds before releasing them; a second one releases them at once. "
        "It exits 1, with one line on stderr, "
        "when the database cannot be used (unreachable, refused, not migrated, "
        "lacking privileges, sealing signing secrets under a key it is not given) or a "
        "permanent database error persists for a lease. Serving several databases, "
        "it starts without those it cannot reach (and keeps trying them), starts again "
        "the dispatcher of one that fails, and exits 1 only when every one has failed.",
    )
    add_database_options(p, many=True)
    p.add_argument(
        "--databases",
        metavar="FILE",
        help="serve every database a TOML file lists, as [[database]] entries of url, "
        "and optionally schema (default: --schema) and label (default: host:port/dbname"
        "[/schema]), besides any --database-url; the process's --concurrency is shared "
        "fairly between them",
    )
    add_secrets_key_option(p)
    p.add_argument(
        "--processes",
        type=integer(1, MAX_PROCESSES),
        default=1,
        help="run this many dispatcher processes on this host (one core each); they "
        f"share the work as separate hosts would (default: 1, at most {MAX_PROCESSES})",
    )
    p.add_argument(
        "--drain",
        action="store_true",
        help="exit once no message is due or running: 0 when none went dead during the "
        "drain, 3 when some did; exit 1 after --drain-timeout without progress",
    )
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        help="json lines (default when stdout is not a terminal) or text",
    )
    log_level = _default(EventLog, "level")
    p.add_argument(
        "--log-level",
        choices=tuple(LEVELS),
        default=log_level,
        help=f"least important event to log (default: {log_level})",
    )

    settings = p.add_argument_group("dispatcher settings")
    add_config_options(settings)
    retry = ExponentialBackoff
    settings.add_argument(
        "--retry-base",
        type=seconds,
        default=retry.base,
        help="delay before the first retry of a failed delivery, in seconds; it is "
        f"multiplied by {retry.factor:g} with each attempt, with jitter "
        f"(default: {retry.base:g})",
    )
    settings.add_argument(
        "--retry-cap",
        type=seconds,
        default=retry.cap,
        help=f"longest delay between retries, in seconds (default: {retry.cap:g})",
    )
    p.set_defaults(handler=cmd_dispatch)
