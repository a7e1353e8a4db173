"""One process serving several databases: a dispatcher per database, side by side.

Each :class:`~dispatchers.runtime.dispatcher.Dispatcher` has everything of its own;
they share the process's ``concurrency`` (through a budget), one metrics port and
the signals. A failed database's dispatcher is restarted after a pause while the
others go on; :meth:`Fleet.run` raises only when every database has failed and
none has claimed since.

Design: docs/explanation/design/fleet.md
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from dispatchers.errors import DispatcherFailed
from dispatchers.runtime import loop as loops
from dispatchers.runtime.backoff import Backoff
from dispatchers.runtime.budget import Budget, Share
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.databases import Served
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from dispatchers.runtime.metrics import Labelled, serve, urls
from dispatchers.runtime.reporting import Stats
from dispatchers.store.postgres import Store

__all__ = ["Fleet", "Member", "run_fleet"]

RESTARTS_UP_TO = 10
"""A failed database's dispatcher is started again after a lease, doubling at each
failure in a row up to this many leases."""


@dataclass(eq=False)
class Member:
    """One database of a fleet: its settings, its share of the request slots, its
    dispatcher (None between a failure and the next start) and what its
    dispatchers did."""

    served: Served
    config: DispatcherConfig
    share: Share
    log: EventLog
    dispatcher: Dispatcher | None = None
    failure: DispatcherFailed | None = None
    """Why its last dispatcher stopped, if it failed."""
    stats: Stats = field(default_factory=Stats)
    """Its dispatchers' counters, those that have stopped."""

    @property
    def label(self) -> str:
        return self.served.label

    @property
    def down(self) -> bool:
        """Failed, and not claimed since (by a dispatcher started again)."""
        return self.failure is not None and (
            self.dispatcher is None or self.dispatcher.stats.claims == 0
        )

    def state(self) -> str:
        """``ok``, ``unreachable``, ``failed`` or (not yet run) ``starting``, as
        ``/healthz`` lists it."""
        if self.dispatcher is None and self.failure is None:
            return "starting"
        if self.dispatcher is None or self.down:
            return "failed"
        return "ok" if self.dispatcher.healthy() else "unreachable"

    def up(self) -> float:
        """``outbox_database_up``: 1 while the database answers its dispatcher."""
        return 1.0 if self.state() == "ok" else 0.0

    def counted(self, stats: Stats) -> None:
        for f in dataclasses.fields(Stats):
            setattr(self.stats, f.name, getattr(self.stats, f.name) + getattr(stats, f.name))


class Fleet:
    """Dispatchers for several databases in one process (see the module's docstring).

    :param databases: what to serve, each with its label (distinct).
    :param config: the settings of every database's dispatcher, but its schema
        (the database's); ``concurrency`` is the whole process's, shared.
    :param log: where events go, each database's labelled ``database``.
    :param transport: an httpx transport every dispatcher sends with (tests).
    """

    def __init__(
        self,
        databases: Sequence[Served],
        config: DispatcherConfig,
        *,
        log: EventLog | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.log = log = log or EventLog()
        self._transport = transport
        budget = Budget(config.concurrency, len(databases))
        self.members = [
            Member(
                served,
                dataclasses.replace(config, schema=served.schema),
                share,
                log.labelled(database=served.label),
            )
            for served, share in zip(databases, budget.shares, strict=True)
        ]
        self._stop = asyncio.Event()
        self._gave_up = False
        self.metrics_server: asyncio.Server | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(Labelled("database", self._registries))
        up = Gauge(
            "outbox_database_up",
            "1 while the database answers (/healthz lists each), 0 while it is "
            "unreachable or its dispatcher failed",
            ["database"],
            registry=self.registry,
        )
        for member in self.members:
            up.labels(member.label).set_function(member.up)

    # -- control ---------------------------------------------------------------

    def stop(self) -> None:
        """Stop every database's dispatcher (asked again: end their grace now)."""
        self._stop.set()
        for member in self.members:
            if member.dispatcher is not None:
                member.dispatcher.stop()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    # -- health and metrics ------------------------------------------------------

    def healthy(self) -> bool:
        """Some database answers: the process has work it can do."""
        return any(member.state() == "ok" for member in self.members)

    def health_text(self) -> bytes:
        return "".join(f"{m.state()} {m.label}\n" for m in self.members).encode()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _registries(self) -> Iterator[tuple[str, CollectorRegistry]]:
        for member in self.members:
            if member.dispatcher is not None:
                yield member.label, member.dispatcher.metrics.registry

    # -- running -----------------------------------------------------------------

    async def run(self, *, drain: bool = False) -> dict[str, Stats]:
        """Serve every database until :meth:`stop` (or, with ``drain``, until each
        is drained); return each database's counters by label.

        Raises :class:`~dispatchers.errors.DispatcherFailed` when every database
        failed (or, in a drain, when any did), once all have shut down."""
        config = self.config
        if config.metrics_port is not None:
            self.metrics_server = await serve(
                self,
                host=config.metrics_host,
                port=config.metrics_port,
                healthy=self.healthy,
                health_text=self.health_text,
            )
        self.log.event(
            "fleet_started",
            databases=[m.label for m in self.members],
            concurrency=config.concurrency,
            shares=[m.share.size for m in self.members],
            **(urls(self.metrics_server) if self.metrics_server is not None else {}),
        )
        tasks = [
            asyncio.create_task(self._serve(m, drain=drain), name=f"outbox-database-{i}")
            for i, m in enumerate(self.members)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            self.stop()
            await loops.stop_tasks([t for t in tasks if not t.done()])
            if self.metrics_server is not None:
                self.metrics_server.close()
        failed = [m for m in self.members if m.failure is not None]
        if self._gave_up or (drain and failed):
            what = "every database failed" if self._gave_up else "a drain failed"
            raise DispatcherFailed(
                f"{what}: " + "; ".join(f"{m.label}: {m.failure}" for m in failed)
            )
        return {m.label: m.stats for m in self.members}

    async def _serve(self, member: Member, *, drain: bool) -> None:
        """Run ``member``'s dispatcher until stopped, and again after it fails."""
        lease = member.config.lease
        pause = Backoff(initial=lease, maximum=RESTARTS_UP_TO * lease, jitter=0.25)
        while not self._stop.is_set():
            dispatcher = Dispatcher(
                member.served.url,
                member.config,
                log=member.log,
                share=member.share,
                serve_metrics=False,
                transport=self._transport,
                store=Store(
                    member.served.url, member.config, name=f"outbox-dispatcher {member.label}"
                ),
            )
            member.dispatcher = dispatcher
            try:
                stats = await dispatcher.run(drain=drain)
            except DispatcherFailed as exc:
                member.counted(dispatcher.stats)
                if dispatcher.stats.claims:
                    pause.reset()  # it served a while: this is a new run of failures
                member.failure, member.dispatcher = exc, None
                if drain or self._stop.is_set():
                    return
                if all(m.down for m in self.members):
                    member.log.event("fleet_failed", error="every database failed")
                    self._gave_up = True
                    self.stop()
                    return
                delay = pause.next()
                member.log.event("database_restarting", error=str(exc), in_s=round(delay, 3))
                await self._wait(delay)
                continue
            member.counted(stats)
            return

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()


def run_fleet(
    databases: Sequence[Served],
    config: DispatcherConfig,
    *,
    drain: bool = False,
    log: EventLog | None = None,
    stopped: Callable[[], bool] | None = None,
    **kwargs: Any,
) -> dict[str, Stats]:
    """Run a :class:`Fleet` on a fresh event loop (as
    :func:`~dispatchers.runtime.dispatcher.run_dispatcher` runs one dispatcher)."""

    async def main() -> dict[str, Stats]:
        fleet = Fleet(databases, config, log=log, **kwargs)
        loops.freeze_heap()
        fleet.install_signal_handlers()
        if stopped is not None and stopped():
            fleet.stop()
        return await fleet.run(drain=drain)

    return loops.run(main(), event_loop=config.event_loop)
