"""The run's dispatcher processes (``outbox dispatch``), and the faults done to
them: SIGKILL, SIGSTOP past the lease then SIGCONT, SIGTERM, each followed by a
fresh process in the victim's place. Every wait is bounded and fails loudly
(``tests.processes.wait_until``); what a fault could not set up as planned (a
victim that held no lease) is noted, not hidden.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.history.history import Fault, Process
from tests.processes import DispatcherProcess, query, wait_until

STOP_TIMEOUT = 30.0
"""Seconds a dispatcher may take to exit after SIGTERM (its grace is 1 s)."""
START_TIMEOUT = 90.0
"""Seconds a dispatcher may take to log ``started`` on two busy cores."""
RESCUE_INTERVAL = 5.0
"""The rescuer's period (``DispatcherConfig.rescue_interval``)."""


@dataclass
class Member:
    process: DispatcherProcess
    started: float
    ended: float | None = None
    how: str = "running"

    @property
    def name(self) -> str:
        return self.process.name


@dataclass
class Fleet:
    url: str
    args: list[str]
    workdir: Path
    lease: float
    members: list[Member] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def start(self) -> Member:
        name = f"d{len(self.members) + 1}"
        member = Member(DispatcherProcess(self.url, self.args, self.workdir, name), time.time())
        self.members.append(member)
        return member

    def running(self) -> list[Member]:
        return [m for m in self.members if m.how == "running"]

    def wait_started(self, members: list[Member]) -> None:
        for m in members:

            def up(m: Member = m) -> bool:
                return _exited(m) or '"event":"started"' in m.process.stdout()

            wait_until(
                up,
                timeout=START_TIMEOUT,
                what=f"{m.name} to start",
                interval=0.1,
                processes=[m.process],
            )
            if not m.process.running():
                raise AssertionError(f"{m.name} exited at start:\n{m.process.describe()}")

    def owner(self, member: Member) -> str | None:
        for event in events(member.process):
            if event.get("event") == "started":
                return str(event.get("owner"))
        return None

    def holding(self, member: Member) -> list[tuple[int, int]]:
        """The (id, attempt) of the rows ``member`` leases now."""
        rows = query(
            self.url,
            "SELECT id, attempts FROM outbox.messages"
            " WHERE state = 'running' AND starts_with(lease_owner, %s)",
            (member.process.owner_prefix,),
        )
        return [(int(a), int(b)) for a, b in rows]

    def victim(self, index: int) -> Member:
        """A running dispatcher, chosen by ``index``, preferring one that leases
        something (waiting a little for one to)."""
        candidates = self.running()
        chosen = candidates[index % len(candidates)]
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: any(self.holding(m) for m in candidates),
                timeout=5.0,
                what="a dispatcher to hold a lease",
                interval=0.05,
            )
        for m in candidates[index % len(candidates) :] + candidates:
            if self.holding(m):
                return m
        self.notes.append(f"{chosen.name} held no lease when chosen as a victim")
        return chosen

    def kill(self, index: int) -> None:
        m = self.victim(index)
        at = time.time()
        m.process.signal(signal.SIGKILL)
        m.process.wait(timeout=10)
        m.ended, m.how = time.time(), "killed"
        self.faults.append(Fault("kill", m.name, at, at))
        self.wait_started([self.start()])

    def freeze(self, index: int, *, through_rescue: bool) -> None:
        """SIGSTOP until every lease it held has run out (and, with
        ``through_rescue``, been rescued), at least one lease long; then SIGCONT."""
        m = self.victim(index)
        at = time.time()
        m.process.signal(signal.SIGSTOP)
        try:
            held = self.holding(m)
            wait_until(
                lambda: (
                    time.time() > at + self.lease
                    and not query(
                        self.url,
                        "SELECT 1 FROM outbox.messages WHERE state = 'running'"
                        " AND starts_with(lease_owner, %s) AND lease_until >= now()",
                        (m.process.owner_prefix,),
                    )
                ),
                timeout=self.lease + 30,
                what=f"the leases of frozen {m.name} to run out",
                interval=0.1,
            )
            if through_rescue and held:
                try:
                    wait_until(
                        lambda: not self.holding(m),
                        timeout=RESCUE_INTERVAL + 10,
                        what=f"the leases of frozen {m.name} to be rescued",
                        interval=0.1,
                    )
                except AssertionError as exc:
                    self.notes.append(str(exc).splitlines()[0])
        finally:
            m.process.signal(signal.SIGCONT)
        until = time.time()
        self.faults.append(
            Fault("freeze", m.name, at, until, f"held {len(held)}, rescue {through_rescue}")
        )

    def terminate(self, index: int) -> None:
        m = self.victim(index)
        at = time.time()
        self.stop(m)
        self.faults.append(Fault("term", m.name, at, time.time()))
        self.wait_started([self.start()])

    def stop(self, m: Member, *, signalled: bool = False) -> None:
        """SIGTERM (unless ``signalled`` already) and wait; a dispatcher that does
        not exit in time is killed (its exit code, None, is reported by the checks)."""
        if not signalled:
            if not m.process.running():
                m.ended, m.how = time.time(), "exited"
                return
            m.process.signal(signal.SIGTERM)
        try:
            m.process.wait(timeout=STOP_TIMEOUT)
        except AssertionError as exc:
            self.notes.append(str(exc).splitlines()[0])
            m.process.kill()
        m.ended, m.how = time.time(), "terminated"

    def stop_all(self) -> None:
        """SIGTERM every running dispatcher at once, then wait for each."""
        for m in self.running():
            if not m.process.running():
                m.ended, m.how = time.time(), "exited"
        members = self.running()
        for m in members:
            m.process.signal(signal.SIGTERM)
        for m in members:
            self.stop(m, signalled=True)

    def kill_all(self) -> None:
        for m in self.members:
            with contextlib.suppress(OSError):
                m.process.signal(signal.SIGCONT)
            m.process.kill()

    def processes(self) -> list[Process]:
        out = []
        for m in self.members:
            counts: dict[str, int] = {}
            lost: list[tuple[int, int, str]] = []
            for event in events(m.process):
                name = str(event.get("event"))
                counts[name] = counts.get(name, 0) + 1
                if name == "lease_lost":
                    with contextlib.suppress(KeyError, TypeError, ValueError):
                        lost.append(
                            (int(event["message_id"]), int(event["attempt"]), str(event["reason"]))
                        )
            out.append(
                Process(
                    name=m.name,
                    pid=m.process.pid,
                    owner=self.owner(m),
                    started=m.started,
                    ended=m.ended,
                    exit_code=m.process.popen.poll(),
                    how=m.how,
                    events=counts,
                    lost=tuple(lost),
                )
            )
        return out


def _exited(m: Member) -> bool:
    return not m.process.running()


def events(process: DispatcherProcess) -> list[dict[str, Any]]:
    """Its JSON log lines; a line cut short by SIGKILL, or a stray non-JSON line,
    is skipped."""
    out = []
    for line in process.stdout().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                out.append(record)
    return out
