"""The dispatcher: claim, deliver, record, shut down.

The claim loop claims up to the free capacity in one statement, committed before
any HTTP work; a message stays held, its lease renewed, until its outcome is
written (twice is harmless: the fence makes it a no-op). It composes the flusher,
the maintenance services, the breakers, the waker and the cadence. Transient
database errors are retried; a persisting permanent error or a stalled drain
stops it through the graceful shutdown, and :meth:`Dispatcher.run` raises it.

The module stays whole past the usual length: claiming, capacity and shutdown are
one state machine, whose transitions a reader must check together.

Design: docs/explanation/design/dispatcher.md
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from dispatchers.delivery.client import HttpClient
from dispatchers.delivery.http import Sender
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.tracing import attempt_spans
from dispatchers.errors import DispatcherFailed
from dispatchers.runtime import completions
from dispatchers.runtime import loop as loops
from dispatchers.runtime.alerts import KeyAlerts, LagWatch
from dispatchers.runtime.backoff import Backoff
from dispatchers.runtime.breakers import Breakers
from dispatchers.runtime.budget import Budget, Share
from dispatchers.runtime.cadence import Cadence
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.flights import Flight, Flights
from dispatchers.runtime.flusher import Flusher, OutcomeWriter
from dispatchers.runtime.log import EventLog
from dispatchers.runtime.maintenance import (
    BacklogGauge,
    Heartbeat,
    Partitions,
    Rescuer,
    Retention,
)
from dispatchers.runtime.metrics import serve, urls
from dispatchers.runtime.reporting import Reporter, Stats
from dispatchers.runtime.unseal import Opener
from dispatchers.runtime.waker import Waker
from dispatchers.runtime.watchdog import Watchdog
from dispatchers.store.messages import Completion
from dispatchers.store.postgres import Store
from dispatchers.store.protocol import DispatchStore

HAND_OFF_AFTER = 0.1
"""Seconds a dispatcher on duty may have every request slot taken before it hands
duty to another (a drain fills them for moments at a time; slow receivers for
longer)."""


CLAIM_RETRY_MAX = 2.0
"""The longest pause between two claims that failed (the first pauses 0.05 s,
doubling): once the database answers again, deliveries resume within about this
(the pool connects again at once when a claim asks, see
:data:`~dispatchers.store.postgres.RECONNECT_TIMEOUT`)."""


def make_owner() -> str:
    """A lease owner id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Dispatcher:
    """Delivers outbox messages from one PostgreSQL database.

    :param conninfo: a libpq connection string or URL.
    :param config: settings (validated on construction).
    :param transport: an httpx transport to send with, instead of the default
        SSRF-guarded one.
    :param client: an :class:`~dispatchers.delivery.http.HttpClient` to send with instead
        (neither is closed by the dispatcher).
    :param log: where events go (default: JSON lines on stdout).
    :param owner: the lease owner id (default: :func:`make_owner`).
    :param tracer_provider: the OpenTelemetry ``TracerProvider`` of the attempts'
        spans (default: the global one, when ``opentelemetry-api`` is installed;
        see :mod:`dispatchers.delivery.tracing`).
    :param store: the statements it runs, any :class:`~dispatchers.store.protocol.
        DispatchStore` (default: a :class:`~dispatchers.store.postgres.Store` on
        ``conninfo`` with ``config``); the dispatcher opens and closes it.
    :param share: its part of request slots shared with the dispatchers of other
        databases in this process (default: all of ``config.concurrency``; see
        :mod:`dispatchers.runtime.budget`).
    :param serve_metrics: serve :attr:`metrics` on ``config.metrics_port`` (False
        when the caller serves them, with other databases' on one port).
    """

    def __init__(
        self,
        conninfo: str,
        config: DispatcherConfig | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        client: HttpClient | None = None,
        log: EventLog | None = None,
        owner: str | None = None,
        tracer_provider: Any = None,
        store: DispatchStore | None = None,
        share: Share | None = None,
        serve_metrics: bool = True,
    ) -> None:
        self.conninfo = conninfo
        self.config = config = config or DispatcherConfig()
        self.owner = owner or make_owner()
        self._watchdog = Watchdog(
            patience=config.lease, stall=config.drain_timeout, on_failure=self._fail
        )
        self._report = report = Reporter(log or EventLog(), watchdog=self._watchdog)
        self.log = report.log
        self.stats = report.stats
        self.metrics = report.metrics
        self._flights = flights = Flights(config.per_destination)
        self.metrics.in_flight.set_function(lambda: len(flights))
        self.metrics_server: asyncio.Server | None = None
        self._serve_metrics = serve_metrics
        self._share = share = share or Budget(config.concurrency).shares[0]
        # Built here, opened by run(): a Dispatcher runs once.
        self._store = store = store or Store(conninfo, config)
        self._opener = Opener(config.keyring)  # secrets and TLS, opened after each claim
        self._sender = Sender(
            config, transport=transport, client=client, spans=attempt_spans(tracer_provider)
        )
        self._breakers = Breakers(store, report, owner=self.owner, config=config)
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()  # a second stop: end the grace period now
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        share.notify = self._capacity.set  # slots another database's requests gave back
        self._shutting_down = False
        self._draining = False
        self._remaining: tuple[int, int] | None = None  # (due, running) at the last drain check
        writer = OutcomeWriter(
            store,
            report,
            owner=self.owner,
            flights=flights,
            written=self._written,
            dropped=self._dropped,
        )
        # a batch gathers until three quarters of the concurrency wait, or for
        # flush_interval
        self._outcomes: Flusher[Completion] = Flusher(
            writer.write,
            size=max(1, config.concurrency * 3 // 4),
            interval=config.flush_interval,
            batch=config.flush_batch,
            on_error=lambda exc: report.internal_error("flush", exc),
        )
        self._services = (
            Heartbeat(
                store,
                report,
                owner=self.owner,
                interval=config.renew_interval,
                flights=flights,
                lost=self._lose,
            ),
            Rescuer(store, report, interval=config.rescue_interval, rescued=self._wake.set),
            Partitions(
                store,
                report,
                interval=config.retention_interval,
                retention=config.retention,
                ahead=config.history_ahead,
                step=config.history_partition,
                batch=config.retention_batch,
            ),
            Retention(
                store, report, interval=config.retention_interval, batch=config.retention_batch
            ),
        ) + (
            (
                BacklogGauge(
                    store,
                    report,
                    interval=config.backlog_interval,
                    top=config.backlog_destinations,
                    lag=(
                        LagWatch(store, report, threshold=config.lag_alert)
                        if config.lag_alert is not None
                        else None
                    ),
                ),
            )
            if config.metrics_port is not None or config.lag_alert is not None
            else ()
        )
        self._key_alerts = KeyAlerts(store, report, owner=self.owner)
        self._cadence = Cadence(window=config.claim_window, poll_interval=config.poll_interval)
        self._waker = (
            Waker(
                conninfo,
                config,
                on_notify=self._wake.set,
                on_change=self._wake.set,
                log=report.log,
            )
            if config.listen
            else None
        )

    # -- control -------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming now; in-flight deliveries get the grace period. Asked
        again while they have it, end it now: what still runs is cut off and
        released, unsent or not, as at the end of the grace period."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()
        # end every wait at once
        self._wake.set()
        self._capacity.set()
        self._outcomes.flush_soon()

    def _fail(self, failure: DispatcherFailed) -> None:
        """Stop on what will not heal; :meth:`run` raises ``failure`` once shut down."""
        self._report.failed(failure)
        self.stop()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    @property
    def waker(self) -> Waker | None:
        """The waker (None with ``listen`` off)."""
        return self._waker

    @property
    def round_trips(self) -> int:
        """Statements sent so far, the waker's included: each is a round trip."""
        return self._store.round_trips + (self._waker.round_trips if self._waker else 0)

    def healthy(self) -> bool:
        """The database answers: no operation found it unreachable since its last
        answer (a lost connection, none to be had, no answer in time), and it
        answered within the last lease period (errors it answers with, such as
        a missing privilege, count after a lease, as they stop the dispatcher)."""
        metrics = self.metrics
        if metrics.db_unreachable_since is not None:
            return False
        since = time.monotonic() - metrics.last_db_success
        return since < max(self.config.lease, 3 * self.config.poll_interval)

    async def run(self, *, drain: bool = False) -> Stats:
        """Run until :meth:`stop` (or, with ``drain``, until no message is due or
        running anywhere); then shut down gracefully and return the counters.

        Raises :class:`~dispatchers.errors.DispatcherFailed`, once shut down, when
        a permanent database error persisted for a lease, when a drain made no
        progress for ``drain_timeout``, or when a drain was stopped while the
        database was failing.
        """
        config = self.config
        if config.metrics_port is not None and self._serve_metrics:
            # bound first, before anything needs undoing (a pool left behind)
            self.metrics_server = await serve(
                self.metrics,
                host=config.metrics_host,
                port=config.metrics_port,
                healthy=self.healthy,
            )
        helpers: list[asyncio.Task[Any]] = []
        try:
            await self._store.open()
            self._report.started(
                schema=config.schema,
                owner=self.owner,
                concurrency=config.concurrency,
                wakeups="listen" if config.listen else "poll",
                poll_interval_s=config.poll_interval,
                event_loop=loops.running(),
                http_client=config.http_client,
                proxy=None if config.proxy is None else str(config.proxy),  # credentials masked
                ssrf_guard=config.ssrf_guard,
                **(urls(self.metrics_server) if self.metrics_server is not None else {}),
            )
            helpers.append(asyncio.create_task(self._outcomes.run(), name="outbox-flusher"))
            helpers += [
                asyncio.create_task(s.run(), name=f"outbox-{type(s).__name__.lower()}")
                for s in self._services
            ]
            if self._waker is not None:
                helpers.append(asyncio.create_task(self._waker.run(), name="outbox-waker"))
            if drain:
                helpers.append(asyncio.create_task(self._watch_drain(), name="outbox-drain-watch"))
            self._draining = drain
            drained = await self._claim_loop(drain=drain)
            if drain and not drained:
                self._watchdog.check_interrupted()
            await self._shutdown()
        finally:
            # cancelled again if one lets the first cancellation pass (see stop_tasks)
            if await loops.stop_tasks(helpers):
                self._report.internal_error("shutdown", RuntimeError("a helper did not stop"))
            for flight in self._flights:
                if flight.task is not None:
                    flight.task.cancel()
            if self.metrics_server is not None:
                self.metrics_server.close()
            await self._sender.aclose()
            await self._key_alerts.settle()  # alerts being raised, before the store goes
            self._share.wanting = False  # a stopped loop wants no room of the others'
            await self._store.close()
            self.stats.round_trips = self.round_trips
        if self._watchdog.failure is not None:
            raise self._watchdog.failure
        return self.stats

    # -- claiming --------------------------------------------------------------

    async def _claim_loop(self, *, drain: bool) -> bool:
        """Claim and start deliveries until stopped; True when a drain finished."""
        config = self.config
        share = self._share
        low_water = max(1, min(config.batch_size, share.size) * 3 // 4)
        held_limit = 2 * config.concurrency
        backoff = Backoff(maximum=CLAIM_RETRY_MAX)
        full_since: float | None = None  # when every request slot was last taken
        while not self._stop.is_set():
            # Requests in flight are bounded by the concurrency; the messages held
            # (sending, or waiting for their outcome write) by twice that.
            flights = self._flights
            free = min(share.free(), held_limit - len(flights))
            enough = low_water
            if flights.at_bound and flights.crowded:
                # The slots of destinations at their bound may not free up for a
                # long while (one that hangs holds them until the request timeout):
                # wait for a share of the others only.
                others = config.concurrency - flights.at_bound * config.per_destination
                enough = max(1, min(config.batch_size, others) * 3 // 4)
            if free <= 0 or (free < enough and flights):
                # Wait for capacity rather than claiming a handful at a time.
                self._capacity.clear()
                share.wanting = True
                if len(flights) >= held_limit:
                    self._outcomes.flush_soon()  # held outcomes are what blocks: write them
                seconds: float | None = config.flush_interval if free > 0 else None
                if free <= 0 and self._waker is not None and self._waker.want_duty:
                    # Full for a while (slow receivers): hand duty to a dispatcher
                    # with room, so that new messages do not wait for our slots.
                    now = time.monotonic()
                    full_since = full_since if full_since is not None else now
                    if now - full_since >= HAND_OFF_AFTER:
                        self._waker.request(duty=False)
                    else:
                        seconds = full_since + HAND_OFF_AFTER - now
                await self._wait(self._capacity, seconds=seconds)
                continue
            full_since = None
            if self._waker is not None:
                self._waker.request(duty=True)
            want = min(free, config.batch_size)
            self._wake.clear()
            sent_at = time.monotonic()
            share.take(want)  # no other database's loop is given these slots meanwhile
            try:
                claim = await self._store.claim(self.owner, want, flights.sending_to, flights.alone)
            except Exception as exc:
                share.give_back(want)
                self._report.db_error("claim", exc)
                await self._wait(self._stop, seconds=backoff.next())
                continue
            share.wanting = False
            share.give_back(want - len(claim.messages))
            backoff.reset()
            jobs = [self._opener.job(claimed) for claimed in claim.messages]
            self._cadence.claimed(len(jobs), want, sent_at, rate_wait=claim.rate_wait)
            if self._waker is not None:
                self._waker.request(wake=not self._cadence.busy)
            self._report.claimed_batch(len(jobs))
            if self._stop.is_set():
                # The claim committed after the stop signal: release, never start.
                self._release_unstarted(jobs)
                return False
            flights.claimed(jobs)
            for job in jobs:
                self._start(job)
            if len(jobs) < want:
                if drain and not flights and await self._drained():
                    return True
                await self._until_next_claim()
        return False

    async def _until_next_claim(self) -> None:
        """Wait as the cadence says: for the timer, or a notification (or another
        wake-up), and then at least until ``claim_window`` after the last claim."""
        waker = self._waker
        at = self._cadence.next_claim(
            on_duty=waker is not None and waker.on_duty,
            notified=waker is not None and waker.notified,
        )
        now = time.monotonic()
        if at > now:
            await self._wait(self._wake, seconds=at - now)
        earliest = self._cadence.earliest_claim()
        now = time.monotonic()
        if earliest > now:  # what arrives meanwhile is claimed together
            await self._wait(self._stop, seconds=earliest - now)

    async def _drained(self) -> bool:
        try:
            due, running, scheduled = await self._store.work_remaining()
        except Exception as exc:
            self._report.db_error("drain_check", exc)
            return False
        self._report.answered("drain_check")
        if (due, running) != self._remaining:  # others' work counts as progress too
            self._remaining = (due, running)
            self._report.progressed()
        if due == 0 and running == 0:
            self._report.drained(scheduled)
            return True
        return False

    async def _watch_drain(self) -> None:
        """End a drain that has made no progress for ``drain_timeout``."""
        period = min(1.0, self.config.drain_timeout / 10)
        while not self._stop.is_set():
            await self._wait(self._stop, seconds=period)
            if not self._stop.is_set():
                self._watchdog.check_stall()

    def _start(self, job: Job) -> None:
        stale = self._flights.drop(job.id)
        if stale is not None:
            # Claimed again while an older attempt is still held here (its lease ran
            # out while this process could not write): that attempt is lost.
            self._lost(stale, stale.job.attempts, "claimed again")
        flight = self._flights.hold(job)
        if job.secrets_unavailable is not None:
            # Never sent unsigned: given back unsent until the key is here.
            withheld = completions.withheld(job)
            self._report.secrets_unavailable(job, withheld.delay)
            if job.missing_keys:
                self._key_alerts.missing(job.missing_keys, job.endpoint_id)
            self._outcomes.add(job.id, withheld)
            self._share.give_back()  # never sent: its slot was not used
            return
        self._flights.sending_started(job)
        self.stats.claimed += 1
        if job.probe:
            self._report.probing(job)
        if self.log.enabled("claimed"):
            self.log.event("claimed", message_id=job.id, attempt=job.attempts)
        flight.task = asyncio.create_task(self._attempt(flight))
        # a callback, not a finally: it runs even for a task cancelled before it started
        flight.task.add_done_callback(functools.partial(self._sent, job.destination))

    def _release_unstarted(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._flights.hold(job)
            self._outcomes.add(job.id, completions.released(job))
        self._share.give_back(len(jobs))

    # -- delivering ------------------------------------------------------------

    def _sent(self, destination: str, task: asyncio.Task[None]) -> None:
        self._share.give_back()
        if self._flights.sending_ended(destination):
            # The last claim may have passed this destination's due messages over
            # for want of room there, and no notification announces room.
            self._wake.set()
        self._capacity.set()

    async def _attempt(self, flight: Flight) -> None:
        job = flight.job
        started_at = datetime.now(UTC)
        start = time.monotonic()
        try:
            attempt = await self._sender.send(job)
        except asyncio.CancelledError:
            if self._shutting_down and self._flights.get(job.id) is flight:
                # Grace expired: give the message back, fenced.
                duration_ms = int((time.monotonic() - start) * 1000)
                self._outcomes.add(
                    job.id,
                    completions.released(job, started_at=started_at, duration_ms=duration_ms),
                )
            raise
        if self._flights.get(job.id) is not flight:
            return  # lease lost while sending: the outcome is dropped
        try:
            completion = completions.from_attempt(job, attempt, self.config)
        except Exception as exc:  # a retry policy that raised: retry soon rather than stall
            self._report.internal_error("decide", exc)
            completion = completions.policy_failed(job, attempt, exc)
        self._outcomes.add(job.id, completion)
        if completion.outcome == "blocked":
            self._report.destination_blocked(job, attempt.outcome.error, completion.delay)
        # after the outcome is held: a shutdown that cancels this write loses nothing
        await self._breakers.attempted(job, attempt.outcome)

    # -- recording outcomes (the outcome writer's side) ----------------------------

    def _written(self, unblocked: bool) -> None:
        self._capacity.set()
        if unblocked or (self._draining and not self._flights):
            # The next message of that ordering key may be due now, and nobody
            # announces it; or nothing is held: see whether the drain is done.
            self._wake.set()

    def _dropped(self, completion: Completion) -> None:
        self._outcomes.discard(completion.id, completion)
        self._flights.settle(completion.id, completion.attempt)
        self._capacity.set()

    # -- leases (the heartbeat's side) ---------------------------------------------

    def _lose(self, message_id: int, attempt: int) -> None:
        """The heartbeat did not find this lease: stop its delivery."""
        flight = self._flights.drop(message_id)
        if flight is not None:
            self._lost(flight, attempt, "lease not renewed")

    def _lost(self, flight: Flight, attempt: int, reason: str) -> None:
        self._outcomes.discard(flight.job.id)
        if flight.task is not None and not flight.task.done():
            flight.task.cancel()
        self._report.lease_lost(flight.job.id, attempt, reason)
        self._capacity.set()

    # -- shutdown ---------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Give in-flight deliveries the grace period, release the rest, record all."""
        self._shutting_down = True
        running = self._flights.running()
        if running:
            self._report.stopping(len(running), self.config.grace)
            hurry: asyncio.Task[Any] = asyncio.create_task(self._hurry.wait())
            everyone: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
            try:
                await asyncio.wait(
                    [everyone, hurry],
                    timeout=self.config.grace,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                hurry.cancel()
            await loops.stop_tasks([task for task in running if not task.done()])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(5.0, 3 * self.config.statement_timeout)
        while self._outcomes and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._outcomes.flush()
        if self._outcomes:
            self._report.outcomes_unrecorded(len(self._outcomes))

    # -- helpers ------------------------------------------------------------------

    async def _wait(self, event: asyncio.Event, *, seconds: float | None) -> None:
        """Wait for ``event``, at most ``seconds``. :meth:`stop` sets every event
        that is waited on, so the stop signal ends every wait too."""
        if event.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()


def run_dispatcher(
    conninfo: str,
    config: DispatcherConfig,
    *,
    drain: bool = False,
    log: EventLog | None = None,
    stopped: Callable[[], bool] | None = None,
) -> Stats:
    """Run a dispatcher on a fresh event loop (of the kind ``config.event_loop``
    names) with SIGTERM/SIGINT handlers; ``stopped`` says whether a stop was asked
    for before they were installed (the dispatcher then stops at once)."""

    async def main() -> Stats:
        dispatcher = Dispatcher(conninfo, config, log=log)
        loops.freeze_heap()
        dispatcher.install_signal_handlers()
        if stopped is not None and stopped():
            dispatcher.stop()
        return await dispatcher.run(drain=drain)

    return loops.run(main(), event_loop=config.event_loop)
