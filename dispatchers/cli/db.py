"""``outbox db``: the embedded PostgreSQL as a server of its own.

Every command that is given no database URL uses the embedded server and holds it
only while it runs. ``db start`` keeps it running (in the foreground, or as a
detached keeper with ``--detach``) so that other programs (your own scripts, the
examples) can use its URL, which ``db url`` prints; ``db stop`` ends the keeper.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from dispatchers import environment
from dispatchers.cli._common import Commands, UsageError, require_extra
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit, fields

READY_TIMEOUT = 120.0
"""Seconds a detached keeper gets to start the server (initdb included)."""


def _path() -> Path:
    require_extra("embedded")
    from dispatchers.embedded import embedded_path

    return embedded_path()


def _log_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.keeper.log")


def _detach(path: Path) -> str:
    """Start a keeper in a session of its own; return the URL once the server runs."""
    from dispatchers.embedded import keeper_pid, server_state

    log = _log_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "dispatchers.cli", "db", "start"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={**os.environ, environment.EMBEDDED_DIR_VARIABLE: str(path)},
            start_new_session=True,
        )
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        state = server_state(path)
        if state.running and state.url and keeper_pid(path) == child.pid:
            return state.url
        if child.poll() is not None:
            raise UsageError(f"the embedded server did not start; see {log}")
        time.sleep(0.1)
    child.terminate()
    raise UsageError(f"the embedded server did not start within {READY_TIMEOUT:g} s; see {log}")


def cmd_url(args: argparse.Namespace) -> ExitCode:
    from dispatchers.embedded import server_state

    path = _path()
    state = server_state(path)
    if state.running and state.url and state.keeper_pid is not None:
        url = state.url
    else:
        url = _detach(path)
        print(
            f"outbox: started the embedded PostgreSQL in {path}; it runs until `outbox db stop`",
            file=sys.stderr,
        )
    emit(args, {"url": url, "path": str(path)}, url)
    return ExitCode.OK


def cmd_start(args: argparse.Namespace) -> ExitCode:
    from dispatchers.embedded import keep, server_state

    path = _path()
    state = server_state(path)
    if state.keeper_pid is not None and state.url:
        emit(
            args,
            {"url": state.url, "path": str(path), "keeper_pid": state.keeper_pid},
            f"already running in {path} (keeper pid {state.keeper_pid}): {state.url}",
        )
        return ExitCode.OK
    if args.detach:
        url = _detach(path)
        emit(args, {"url": url, "path": str(path)}, f"running in {path}: {url}")
        return ExitCode.OK

    def ready(url: str) -> None:
        print(f"outbox: the embedded PostgreSQL in {path} runs until interrupted", file=sys.stderr)
        print(url, flush=True)

    keep(path, ready=ready)
    return ExitCode.OK


def cmd_stop(args: argparse.Namespace) -> ExitCode:
    from dispatchers.embedded import server_state, stop_server

    path = _path()
    before = server_state(path)
    after, sessions = stop_server(path, force=args.force)
    if sessions:
        text = (
            f"still running: {len(sessions)} session(s) connected through its URL: "
            f"{', '.join(sessions)}; stop those programs first (--force stops it now)"
        )
    elif not after.running:
        text = "stopped" if before.running else "not running"
    else:
        others = ", ".join(map(str, after.holders)) or "none known"
        text = (
            f"still running: used by process(es) {others}; it stops when they exit "
            "(--force stops it now)"
        )
    emit(args, {**dataclasses.asdict(after), "sessions": sessions}, text)
    return ExitCode.FAILURE if sessions else ExitCode.OK


def cmd_status(args: argparse.Namespace) -> ExitCode:
    from dispatchers.embedded import client_sessions, server_state

    state = server_state(_path())
    sessions = client_sessions(state.url) if state.running and state.url else []
    emit(
        args,
        {**dataclasses.asdict(state), "sessions": sessions},
        fields(
            [
                ("path", state.path),
                ("running", "yes" if state.running else "no"),
                ("url", state.url),
                ("postmaster pid", state.postmaster_pid),
                ("keeper pid", state.keeper_pid),
                ("processes using it", ", ".join(map(str, state.holders)) or None),
                ("sessions through its URL", ", ".join(sessions) or None),
            ]
        ),
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    db = commands.add_parser(
        "db",
        help="the embedded PostgreSQL: url, start, stop, status",
        description="The embedded PostgreSQL that commands use when no database URL is "
        "given (in $OUTBOX_EMBEDDED_DIR, default ./.outbox/pg). It runs while some "
        "outbox process uses it; `db start` keeps it running for other programs.",
    )
    sub = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser(
        "url",
        help="print the server's URL, starting a detached keeper if none runs",
        description="Print the embedded server's URL. If no keeper runs, start one "
        "(as `db start --detach` does), so the URL stays usable until `db stop`: "
        "export OUTBOX_DATABASE_URL=$(outbox db url)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_url, name="db url")
    p = sub.add_parser(
        "start",
        help="keep the server running: in the foreground until interrupted, or detached",
        description="Keep the embedded server running and print its URL: in the "
        "foreground until SIGINT or SIGTERM, or with --detach as a background keeper "
        "that `outbox db stop` ends.",
    )
    p.add_argument("--detach", action="store_true", help="run the keeper in the background")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_start, name="db start")
    p = sub.add_parser(
        "stop",
        help="end the keeper; the server stops once no other process uses it",
        description="End the keeper started by `db start`. The server stops once no "
        "other outbox process (a dispatcher, say) uses it; while programs are "
        "connected through its URL (OUTBOX_DATABASE_URL=$(outbox db url)), nothing is "
        "stopped and they are listed (exit 1). --force stops it now.",
    )
    p.add_argument(
        "--force", action="store_true", help="stop the server now, even while others use it"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_stop, name="db stop")
    p = sub.add_parser(
        "status",
        help="whether the server runs, its URL, who uses it",
        description="Say whether the embedded server runs, its URL, the pids of its "
        "postmaster and keeper, and which processes use it (it stops after the last).",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_status, name="db status")
