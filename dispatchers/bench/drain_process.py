"""One drain in a fresh process of its own, and the figures it sends back.

Why a process per drain: peak RSS only grows, so in the bench's own process it
would report the largest drain so far (or the seeding of a million rows), and
freed memory kept by the allocator would blur what one drain needs. Sampling the
RSS during the drain would miss a short burst between samples. A fresh process
doing only the drain is what ``outbox dispatch`` is: its ``ru_maxrss`` is exact,
whatever the burst. Its size once everything is imported (before the drain) is
reported too, so the growth the drain caused can be told from the interpreter and
its libraries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from dispatchers.bench import Settings
from dispatchers.bench.baselines.naive import NaiveStats, run_naive
from dispatchers.bench.env import SPAWN
from dispatchers.bench.measure import NoopClient, peak_rss, recording_tracer_provider, rss_now
from dispatchers.runtime import loop as loops
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog

DRAIN_START_TIMEOUT = 120.0  # seconds for a drain process to import and report ready


@dataclass(frozen=True)
class Drained:
    """What a drain process reports: the design's counters (the naive design has no
    leases, dead letters or flushes), the drain's wall and CPU seconds, and the
    process's peak RSS in bytes."""

    delivered: int
    retried: int
    round_trips: int
    claims: int
    timed_out: bool
    dead: int | None = None
    lease_lost: int | None = None
    db_errors: int | None = None
    flushes: int | None = None
    seconds: float = 0.0
    cpu_s: float = 0.0
    peak_rss: int = 0


async def _drain_ours(url: str, s: Settings, schema: str, http: bool) -> Drained:
    config = DispatcherConfig(
        schema=schema,
        concurrency=s.concurrency,
        batch_size=s.batch_size,
        allow_private_networks=True,
        http_client=s.http_client or DispatcherConfig.http_client,
    )
    client = None if http else NoopClient()
    tracer_provider = recording_tracer_provider() if s.trace else None
    dispatcher = Dispatcher(
        url, config, client=client, log=NullLog(), tracer_provider=tracer_provider
    )
    timed_out = False
    try:
        async with asyncio.timeout(s.drain_timeout):
            await dispatcher.run(drain=True)
    except TimeoutError:
        timed_out = True
    finally:
        if tracer_provider is not None:
            tracer_provider.shutdown()
    st = dispatcher.stats
    return Drained(
        delivered=st.delivered,
        retried=st.retried,
        dead=st.dead,
        lease_lost=st.lease_lost,
        db_errors=st.db_errors,
        round_trips=st.round_trips,
        claims=st.claims,
        flushes=st.flushes,
        timed_out=timed_out,
    )


async def _drain_naive(url: str, s: Settings, schema: str, http: bool) -> Drained:
    stats = NaiveStats()
    timed_out = False
    try:
        async with asyncio.timeout(s.drain_timeout):
            await run_naive(url, schema, workers=s.naive_workers, http=http, stats=stats)
    except TimeoutError:
        timed_out = True
    return Drained(
        delivered=stats.delivered,
        retried=stats.retried,
        round_trips=stats.round_trips,
        claims=stats.claims,
        timed_out=timed_out,
    )


def _drain_process(
    url: str, settings: Settings, schema: str, design: str, http: bool, pipe: Connection
) -> None:
    """The child's side of :class:`DrainProcess`: report the resident size once
    everything is imported, wait for ``go``, drain, and send back the figures with
    the drain's wall and CPU seconds and the process's peak RSS."""
    drain = _drain_ours if design == "outbox" else _drain_naive
    loops.freeze_heap()  # as outbox dispatch does
    pipe.send(rss_now())
    if not pipe.poll(DRAIN_START_TIMEOUT) or pipe.recv() != "go":
        return
    cpu0, wall0 = time.process_time(), time.perf_counter()
    figures = loops.run(drain(url, settings, schema, http), event_loop=settings.event_loop)
    pipe.send(
        dataclasses.replace(
            figures,
            seconds=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
            peak_rss=peak_rss(),
        )
    )


class DrainProcess:
    """One drain by ``design`` ("outbox" or "naive") in a fresh process; a context
    manager.

    Entering starts the process and waits until it is ready; :meth:`run` starts
    the drain and returns its figures (the caller reads its own clocks around it);
    leaving always ends the process.
    """

    def __init__(
        self, url: str, settings: Settings, schema: str, *, design: str, http: bool
    ) -> None:
        self.settings = settings
        self._pipe, theirs = SPAWN.Pipe()
        self._process = SPAWN.Process(
            target=_drain_process,
            args=(url, settings, schema, design, http, theirs),
            name=f"outbox-bench-drain-{design}",
            daemon=True,
        )
        self._theirs = theirs
        self.rss_ready: int | None = None

    def __enter__(self) -> DrainProcess:
        self._process.start()
        self._theirs.close()  # so that the child's exit reads as end of file here
        try:
            self.rss_ready = self._receive(DRAIN_START_TIMEOUT, "start")
        except BaseException:
            self._end()
            raise
        return self

    def run(self) -> Drained:
        self._pipe.send("go")
        figures: Drained = self._receive(self.settings.drain_timeout + 60, "drain")
        return figures

    def _receive(self, timeout: float, what: str) -> Any:
        try:
            if self._pipe.poll(timeout):
                return self._pipe.recv()
        except EOFError:
            pass
        self._process.join(5)
        raise RuntimeError(f"the drain process did not {what} (exit code {self._process.exitcode})")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()

    def _end(self) -> None:
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
        self._pipe.close()
