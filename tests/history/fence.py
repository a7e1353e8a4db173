"""A stale outcome fenced out, arranged: the write the lease fence exists for.

The receivers hold the next request to a plain destination (``trap``); the
harness finds the dispatcher that sent it, by its row's lease owner; the receiver
answers it and stops that dispatcher (SIGSTOP) :data:`FIRST_DELAY` later, once
the answer is read and its outcome waits in the dispatcher's buffer (written
``flush_interval``, 50 ms, after it came). The lease runs out, another dispatcher
rescues it, then the stopped one goes on (SIGCONT): its buffered outcome is due
before its heartbeat, the write finds the row no longer its own, and the
dispatcher logs ``lease_lost`` "outcome fenced out". Stopped too early (the
answer not yet read), its heartbeat finds the lease gone first ("lease not
renewed"), and the next try stops it later; too late (the outcome already
written), the next try stops it sooner. At most :data:`TRIES` tries, each wait
bounded; what came of each is a ``fence`` fault, a try that could not be set up
a note.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Protocol

from tests.history.fleet import RESCUE_INTERVAL, Fleet, Member, events
from tests.history.history import Destination, Fault
from tests.processes import query, wait_until

TRIES = 3
FIRST_DELAY = 0.02
"""Seconds from the answer to the stop, at the first try."""
STEP = 0.012
"""How much later (a try that stopped too early) the next try stops."""
FENCED = "outcome fenced out"
"""The reason of the dispatcher's ``lease_lost`` event for a write the fence stopped
(dispatchers/runtime/flusher.py)."""


class Traps(Protocol):
    """What a fence needs of the receivers (``tests.history.run.Receivers``)."""

    traps_path: Path

    def control(self, destination: str, mode: str, **extra: object) -> None: ...


def fence(
    fleet: Fleet, receivers: Traps, d: Destination, url: str
) -> tuple[list[Fault], list[str]]:
    """Arrange an outcome fenced out at ``d`` (see the module's docstring): the
    faults done, and notes on the tries that went otherwise."""
    faults: list[Fault] = []
    notes: list[str] = []
    delay = FIRST_DELAY
    for _ in range(TRIES):
        result = _try(fleet, receivers, d, url, delay)
        if isinstance(result, str):
            notes.append(f"fence at {d.name}: {result}")
            if result.startswith("too late"):
                delay /= 2
            continue
        faults.append(result)
        if result.detail.endswith(FENCED):
            break
        delay += STEP
    return faults, notes


def _try(fleet: Fleet, receivers: Traps, d: Destination, url: str, delay: float) -> Fault | str:
    seen = _trapped(receivers.traps_path)
    receivers.control(d.name, "trap")
    try:
        key = wait_until(
            lambda: _trapped(receivers.traps_path)[len(seen) :],
            timeout=5.0,
            what=f"a request to {d.name} to trap",
            interval=0.01,
        )[0]
    except AssertionError as exc:
        return str(exc).splitlines()[0]
    rows = query(
        url,
        "SELECT id, attempts, lease_owner FROM outbox.messages"
        " WHERE target = %s AND idempotency_key = %s AND state = 'running'",
        (d.target, key),
    )
    member = next((m for m in fleet.running() for r in rows if m.process.owns(r[2])), None)
    if member is None or not rows:
        receivers.control(d.name, "release", stop=0, after=0.0)
        return f"no running dispatcher leases the trapped key {key!r}: {rows}"
    mid, attempt, owner = (int(rows[0][0]), int(rows[0][1]), str(rows[0][2]))
    receivers.control(d.name, "release", stop=member.process.pid, after=delay)
    try:
        wait_until(
            lambda: _stopped(member), timeout=3.0, what=f"{member.name} to stop", interval=0.01
        )
    except AssertionError as exc:
        member.process.signal(signal.SIGCONT)  # should the stop come late after all
        return str(exc).splitlines()[0]
    at = time.time()
    try:
        if not _holds(url, mid, attempt, owner):
            return f"too late: {member.name} wrote m{mid}@{attempt} {delay * 1000:.0f} ms after"
        wait_until(
            lambda: not _holds(url, mid, attempt, owner),
            timeout=fleet.lease + RESCUE_INTERVAL + 10,
            what=f"the lease of stopped {member.name} on m{mid} to be rescued",
            interval=0.1,
        )
    finally:
        member.process.signal(signal.SIGCONT)
    until = time.time()
    try:
        reason = wait_until(
            lambda: _lost(member, mid, attempt),
            timeout=10.0,
            what=f"{member.name} to give m{mid}@{attempt} up",
            interval=0.05,
        )
    except AssertionError as exc:
        reason = str(exc).splitlines()[0]
    detail = f"m{mid}@{attempt} stopped {delay * 1000:.0f} ms after its answer: {reason}"
    return Fault("fence", member.name, at, until, detail)


def _trapped(path: Path) -> list[str]:
    """The keys the receivers trapped so far, in order."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            out.append(str(json.loads(line)["key"]))
    return out


def _stopped(member: Member) -> bool:
    """Whether the process is stopped (Linux: its state in ``/proc``)."""
    try:
        stat = Path(f"/proc/{member.process.pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "T"


def _holds(url: str, mid: int, attempt: int, owner: str) -> bool:
    return bool(
        query(
            url,
            "SELECT 1 FROM outbox.messages WHERE id = %s AND attempts = %s"
            " AND lease_owner = %s AND state = 'running'",
            (mid, attempt, owner),
        )
    )


def _lost(member: Member, mid: int, attempt: int) -> str | None:
    for event in events(member.process):
        if (
            event.get("event") == "lease_lost"
            and event.get("message_id") == mid
            and event.get("attempt") == attempt
        ):
            return str(event.get("reason"))
    return None
