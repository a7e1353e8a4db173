"""``outbox dispatch --processes N``: run N dispatcher processes on one host.

One asyncio loop uses one core; on a host with more, several processes share the
work as separate hosts would (leases keep them apart). The supervisor starts the
children with the parent's arguments, forwards SIGTERM/SIGINT to them so each
shuts down gracefully, restarts a child that crashes (at most a few times a
minute), and exits 0 once every child has exited 0 (or, still starting, was
ended by the signal it forwarded).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

RESTARTS_PER_MINUTE = 5


def child_argv(argv: Sequence[str], database_url: str | None) -> list[str]:
    """The parent's ``dispatch`` arguments without ``--processes`` and with the
    resolved database URL (so children share the parent's database, embedded
    included, and never start one of their own); with None (several databases,
    each named), the databases as the parent was given them."""
    if database_url is None:
        return _without(argv, ("--processes",))
    return [*_without(argv, ("--processes", "--database-url")), "--database-url", database_url]


def _without(argv: Sequence[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less ``options`` and their values."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in options:
            skip = i + 1 < len(argv)
            continue
        if arg.startswith(tuple(f"{option}=" for option in options)):
            continue
        out.append(arg)
    return out


def supervise(
    argv: Sequence[str],
    database_url: str | None,
    processes: int,
    *,
    drain: bool,
    metrics_port: int | None = None,
) -> int:
    """Run ``processes`` children until they all exit; return the exit code.

    With a ``metrics_port`` other than 0, child ``i`` (from 0) serves its metrics
    on ``metrics_port + i``, a restarted child on the port of the one it replaces:
    one port cannot be bound by several processes."""
    base = [sys.executable, "-m", "dispatchers.cli", *child_argv(argv, database_url)]

    def command(index: int) -> list[str]:
        if not metrics_port:
            return base
        return [*base, "--metrics-port", str(metrics_port + index)]  # the last one counts

    children: list[subprocess.Popen[bytes]] = []
    forwarded: list[int] = []  # the signals received, each passed on to every child
    passed: dict[int, int] = {}  # per child pid, how many of them it was sent
    restarts: list[float] = []

    def received(signum: int, frame: FrameType | None) -> None:
        # Only noted here: the handler may run inside Popen, before the child it
        # starts is in the list, so the loop below passes signals on.
        forwarded.append(signum)

    def pass_on() -> None:
        for child in children:
            for signum in forwarded[passed.get(child.pid, 0) :]:
                if child.poll() is None:
                    child.send_signal(signum)
            passed[child.pid] = len(forwarded)

    # The handlers come before the first child: a signal that came earlier would
    # end the supervisor and leave the children running.
    previous = {sig: signal.signal(sig, received) for sig in (signal.SIGTERM, signal.SIGINT)}
    failed = 0
    try:
        for index in range(processes):
            if forwarded:
                break  # stopping: start no more
            children.append(subprocess.Popen(command(index)))  # noqa: S603
        while any(child.poll() is None for child in children):
            pass_on()
            time.sleep(0.2)
            for index, child in enumerate(children):
                code = child.poll()
                if code is None or code == 0 or forwarded or drain:
                    continue
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 60]
                if len(restarts) >= RESTARTS_PER_MINUTE:
                    print(
                        f"outbox dispatch: a child exited {code}; too many restarts in a "
                        "minute, stopping the others",
                        file=sys.stderr,
                    )
                    forwarded.append(signal.SIGTERM)
                    failed = code
                    break
                restarts.append(now)
                print(f"outbox dispatch: a child exited {code}; restarting it", file=sys.stderr)
                children[index] = subprocess.Popen(command(index))  # noqa: S603
        # A child that the forwarded signal ended before its dispatcher installed
        # handlers had claimed nothing, whether the signal killed it (-signum) or
        # the command line's own handler exited (128 + signum): a clean stop too.
        clean = {0} | {-sig for sig in forwarded} | {128 + sig for sig in forwarded}
        codes = [0 if code in clean else code for code in (child.wait() for child in children)]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        return failed
    return next((code for code in codes if code != 0), 0)
