"""The dispatcher pool: claim, deliver, renew, record, rescue, shut down.

One process runs up to ``concurrency`` deliveries at once on one asyncio loop:

- the **claimer** claims up to the free capacity in one statement (committed
  before any HTTP work), once three quarters of it is free, and starts a delivery
  task per message; capacity is ``concurrency`` requests in flight, and at most
  as many again whose outcome awaits its write (so claiming overlaps the writing
  of outcomes);
- the **heartbeat** renews every lease the process holds in one statement per
  ``lease / 3``; a lease missing from the result is lost: its delivery is
  cancelled and its outcome dropped;
- the **flusher** writes outcomes in batches, each fenced by owner and attempt:
  it lets a batch gather (until three quarters of the concurrency wait, or for
  ``flush_interval``) and a message stays held (its lease renewed) until its
  outcome is written;
- the **rescuer** returns expired leases of dead dispatchers to ``ready``;
- the **waker** (:mod:`dispatchers.waker`) holds duty and the wake lock on a
  session connection and turns notifications into claims; the claim cadence
  (:mod:`dispatchers.cadence`) gathers what arrives within ``claim_window`` into
  one claim, claims on a timer while messages keep coming (so producers need not
  notify), and polls every ``poll_interval`` when off duty or idle.

Transient database errors pause claiming and are retried; outcomes are kept
until written (writing them twice is harmless: the fence makes it a no-op).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import tenacity

from dispatchers import loop as loops
from dispatchers.cadence import Cadence
from dispatchers.config import DispatcherConfig
from dispatchers.db import Completion, Job, Store, is_transient
from dispatchers.http import Attempt, HttpClient, Sender
from dispatchers.log import EventLog
from dispatchers.metrics import Metrics, serve
from dispatchers.outcome import decide
from dispatchers.waker import Waker

HAND_OFF_AFTER = 0.1
"""Seconds a dispatcher on duty may have every request slot taken before it hands
duty to another (a drain fills them for moments at a time; slow receivers for
longer)."""


def make_owner() -> str:
    """A lease owner id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass
class Stats:
    """Counters of one dispatcher's life, for logs, tests and benchmarks."""

    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lease_lost: int = 0
    rescued: int = 0
    claims: int = 0
    empty_claims: int = 0
    flushes: int = 0
    renewals: int = 0
    history_removed: int = 0
    db_errors: int = 0
    round_trips: int = 0


@dataclass(eq=False)
class _Flight:
    job: Job
    task: asyncio.Task[None] | None = None


@dataclass
class _Backoff:
    """Bounded exponential pause after a database error."""

    initial: float = 0.05
    maximum: float = 5.0
    current: float = field(default=0.0)

    def next(self) -> float:
        self.current = min(self.maximum, self.current * 2 if self.current else self.initial)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


class Dispatcher:
    """Delivers outbox messages from one PostgreSQL database.

    :param conninfo: a libpq connection string or URL.
    :param config: settings (validated on construction).
    :param transport: an httpx transport to send with, instead of the default
        SSRF-guarded one.
    :param client: an :class:`~dispatchers.http.HttpClient` to send with instead
        (neither is closed by the dispatcher).
    :param log: where events go (default: JSON lines on stdout).
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
    ) -> None:
        self.conninfo = conninfo
        self.config = config or DispatcherConfig()
        self.owner = owner or make_owner()
        self.log = log or EventLog()
        self.stats = Stats()
        self.metrics = Metrics()
        self.metrics.in_flight.set_function(lambda: len(self._inflight))
        self.metrics_server: asyncio.Server | None = None
        # Built here, opened by run(): a Dispatcher runs once.
        self._store = Store(conninfo, self.config)
        self._sender = Sender(self.config, transport=transport, client=client)
        self._inflight: dict[int, _Flight] = {}
        self._sending = 0  # flights whose request is not finished
        self._pending: dict[int, Completion] = {}
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        self._pending_ready = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._flush_min = max(1, self.config.concurrency * 3 // 4)
        self._write_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        self._shutting_down = False
        self._draining = False
        self._cadence = Cadence(
            window=self.config.claim_window, poll_interval=self.config.poll_interval
        )
        self._waker = (
            Waker(
                conninfo,
                self.config,
                on_notify=self._wake.set,
                on_change=self._wake.set,
                log=self.log,
            )
            if self.config.listen
            else None
        )

    # -- control -------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming now; in-flight deliveries get the grace period."""
        self._stop.set()
        for event in (self._wake, self._capacity, self._flush_now):
            event.set()  # end every wait at once

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def waker(self) -> Waker | None:
        """The waker (None with ``listen`` off)."""
        return self._waker

    @property
    def round_trips(self) -> int:
        """Statements sent so far, the waker's included: each is a round trip."""
        return self._store.round_trips + (self._waker.round_trips if self._waker else 0)

    def healthy(self) -> bool:
        """The database answered within the last lease period."""
        since = time.monotonic() - self.metrics.last_db_success
        return since < max(self.config.lease, 3 * self.config.poll_interval)

    async def run(self, *, drain: bool = False) -> Stats:
        """Run until :meth:`stop` (or, with ``drain``, until no message is due or
        running anywhere); then shut down gracefully and return the counters."""
        await self._store.open()
        if self.config.metrics_port is not None:
            self.metrics_server = await serve(
                self.metrics,
                host=self.config.metrics_host,
                port=self.config.metrics_port,
                healthy=self.healthy,
            )
        helpers = [
            asyncio.create_task(self._heartbeat_loop(), name="outbox-heartbeat"),
            asyncio.create_task(self._flush_loop(), name="outbox-flusher"),
            asyncio.create_task(self._rescue_loop(), name="outbox-rescuer"),
            asyncio.create_task(self._retention_loop(), name="outbox-retention"),
        ]
        if self._waker is not None:
            helpers.append(asyncio.create_task(self._waker.run(), name="outbox-waker"))
        try:
            self._draining = drain
            await self._claim_loop(drain=drain)
            await self._shutdown()
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            for flight in self._inflight.values():
                if flight.task is not None:
                    flight.task.cancel()
            if self.metrics_server is not None:
                self.metrics_server.close()
            await self._sender.aclose()
            await self._store.close()
            self.stats.round_trips = self.round_trips
        return self.stats

    # -- claiming --------------------------------------------------------------

    async def _claim_loop(self, *, drain: bool) -> None:
        config = self.config
        low_water = max(1, min(config.batch_size, config.concurrency) * 3 // 4)
        held_limit = 2 * config.concurrency
        backoff = _Backoff()
        full_since: float | None = None  # when every request slot was last taken
        while not self._stop.is_set():
            # Requests in flight are bounded by the concurrency; the messages held
            # (sending, or waiting for their outcome write) by twice that.
            free = min(config.concurrency - self._sending, held_limit - len(self._inflight))
            if free <= 0 or (free < low_water and self._inflight):
                # Wait for capacity rather than claiming a handful at a time.
                self._capacity.clear()
                if len(self._inflight) >= held_limit:
                    self._flush_now.set()  # held outcomes are what blocks: write them
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
            try:
                jobs = await self._store.claim(self.owner, want)
            except Exception as exc:
                await self._db_error("claim", exc)
                await self._wait(self._stop, seconds=backoff.next())
                continue
            backoff.reset()
            self._cadence.claimed(len(jobs), want, sent_at)
            if self._waker is not None:
                self._waker.request(wake=not self._cadence.busy)
            self.stats.claims += 1
            if not jobs:
                self.stats.empty_claims += 1
            self.metrics.database_answered()
            self.metrics.claims.inc()
            self.metrics.claim_batch.observe(len(jobs))
            if self._stop.is_set():
                # The claim committed after the stop signal: release, never start.
                self._release_unstarted(jobs)
                break
            for job in jobs:
                self._start(job)
            if len(jobs) < want:
                if drain and not self._inflight and await self._drained():
                    break
                await self._until_next_claim()

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
            await self._db_error("drain_check", exc)
            return False
        if due == 0 and running == 0:
            self.log.event("drained", scheduled_later=scheduled)
            return True
        return False

    def _start(self, job: Job) -> None:
        stale = self._inflight.get(job.id)
        if stale is not None:
            # Claimed again while an older attempt is still held here (its lease ran
            # out while this process could not write): that attempt is lost.
            self._lose(job.id, stale.job.attempts, "claimed again")
        flight = _Flight(job)
        self._inflight[job.id] = flight
        self._sending += 1
        self.stats.claimed += 1
        if self.log.enabled("claimed"):
            self.log.event("claimed", message_id=job.id, attempt=job.attempts)
        flight.task = asyncio.create_task(self._attempt(flight))
        # a callback, not a finally: it runs even for a task cancelled before it started
        flight.task.add_done_callback(self._sent)

    def _release_unstarted(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._inflight[job.id] = _Flight(job)
            self._queue(
                Completion(
                    id=job.id, attempt=job.attempts, state="ready", outcome="released", sent=False
                )
            )

    # -- delivering ------------------------------------------------------------

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending -= 1
        self._capacity.set()

    async def _attempt(self, flight: _Flight) -> None:
        job = flight.job
        started_at = datetime.now(UTC)
        start = time.monotonic()
        try:
            attempt = await self._sender.send(job)
        except asyncio.CancelledError:
            if self._shutting_down and self._inflight.get(job.id) is flight:
                # Grace expired: give the message back, fenced; the attempt counts,
                # since the request may have reached the receiver. Its attempt row
                # needs a start time (attempts.started_at is NOT NULL).
                self._queue(
                    Completion(
                        id=job.id,
                        attempt=job.attempts,
                        state="ready",
                        outcome="released",
                        sent=True,
                        error_class="shutdown",
                        error="released at shutdown before the response arrived",
                        started_at=started_at,
                        duration_ms=int((time.monotonic() - start) * 1000),
                    )
                )
            raise
        if self._inflight.get(job.id) is not flight:
            return  # lease lost while sending: the outcome is dropped
        try:
            completion = self._completion(job, attempt)
        except Exception as exc:  # a retry policy that raised: retry soon rather than stall
            self._internal_error("decide", exc)
            completion = Completion(
                id=job.id,
                attempt=job.attempts,
                state="ready" if job.attempts < job.max_attempts else "dead",
                outcome=str(attempt.outcome.verdict),
                sent=True,
                delay=60.0,
                status=attempt.outcome.status,
                error_class="internal_error",
                error=f"retry policy failed: {type(exc).__name__}",
                started_at=attempt.started_at,
                duration_ms=attempt.duration_ms,
            )
        self._queue(completion)

    def _completion(self, job: Job, attempt: Attempt) -> Completion:
        outcome = attempt.outcome
        webhook = job.endpoint_id is not None
        decision = decide(
            outcome,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            policy=self.config.webhook_retry_policy if webhook else self.config.retry_policy,
            retry_base=job.retry_base,
        )
        return Completion(
            id=job.id,
            attempt=job.attempts,
            state=decision.state,
            outcome=str(outcome.verdict),
            sent=True,
            delay=decision.delay,
            status=outcome.status,
            error_class=outcome.error_class,
            error=outcome.error,
            started_at=attempt.started_at,
            duration_ms=attempt.duration_ms,
            excerpt=attempt.excerpt,
            endpoint_id=job.endpoint_id,
        )

    def _queue(self, completion: Completion) -> None:
        self._pending[completion.id] = completion
        self._pending_ready.set()
        if len(self._pending) >= self._flush_min:
            self._flush_now.set()

    # -- recording outcomes ----------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._pending_ready.wait()
            if not self._flush_now.is_set():
                # Let a batch gather: fewer, larger statements.
                await self._wait(self._flush_now, seconds=self.config.flush_interval)
            self._pending_ready.clear()
            self._flush_now.clear()
            try:
                await self._flush_pending()
            except Exception as exc:  # never let the flusher die: outcomes stay pending
                self._internal_error("flush", exc)
                await asyncio.sleep(1.0)
                self._pending_ready.set()

    async def _flush_pending(self) -> None:
        """Write every pending outcome, in batches, retrying transient errors."""
        async with self._flush_lock:
            while self._pending:
                batch = list(self._pending.values())[: self.config.flush_batch]
                await self._write_outcomes(batch)

    async def _write_outcomes(self, batch: list[Completion]) -> None:
        """Record ``batch``, retrying transient errors until they pass."""
        store = self._store

        tries = 0

        async def write() -> None:
            nonlocal tries
            tries += 1
            async with self._write_lock:
                applied, disabled = await store.complete(self.owner, batch)
                if tries > 1 and len(applied) < len(batch):
                    # An earlier try may have committed with its answer lost: what
                    # it recorded is fenced out now, yet recorded, not lost.
                    unapplied = [c for c in batch if c.id not in applied]
                    applied |= await store.recorded(self.owner, unapplied)
                self.metrics.database_answered()
                self.metrics.flush_batch.observe(len(batch))
                for endpoint_id, reason in disabled.items():
                    self.log.event("endpoint_disabled", endpoint_id=endpoint_id, reason=reason)
                # Settle the books before the heartbeat can look at them again.
                self.stats.flushes += 1
                now = datetime.now(UTC)
                unblocked = False  # a message with an ordering key is done with
                for completion in batch:
                    if self._pending.get(completion.id) is completion:
                        del self._pending[completion.id]
                    flight = self._settle(completion)
                    if completion.id in applied:
                        self._log_outcome(completion, flight, now)
                        unblocked |= flight is not None and flight.job.ordering_key is not None
                    elif flight is not None:  # a flight gone already was logged as lost
                        self._log_lost(completion.id, completion.attempt, "outcome fenced out")
            self._capacity.set()
            if unblocked or (self._draining and not self._inflight):
                # The next message of that ordering key may be due now, and nobody
                # announces it; or nothing is held: see whether the drain is done.
                self._wake.set()

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(is_transient),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=5.0),
            before_sleep=lambda state: self._note_db_error("complete", state),
            reraise=True,
        )
        try:
            await retrying(write)
        except Exception as exc:
            # Not transient: a bug, or one outcome the database refuses. Isolate it
            # by writing the batch one by one; an outcome that still cannot be
            # written is dropped and its lease no longer renewed, so the rescuer
            # hands the message on (it is delivered again, never lost), instead of
            # one bad row blocking every outcome behind it.
            await self._db_error("complete", exc)
            if len(batch) > 1:
                for completion in batch:
                    await self._write_outcomes([completion])
            else:
                self._drop(batch[0])

    def _settle(self, completion: Completion) -> _Flight | None:
        """Stop tracking the flight ``completion`` belongs to and return it; a newer
        claim of the same message (another attempt number) is left alone."""
        flight = self._inflight.get(completion.id)
        if flight is None or flight.job.attempts != completion.attempt:
            return None
        del self._inflight[completion.id]
        return flight

    def _drop(self, completion: Completion) -> None:
        if self._pending.get(completion.id) is completion:
            del self._pending[completion.id]
        self._settle(completion)
        self._capacity.set()
        self.log.event(
            "outcome_dropped",
            message_id=completion.id,
            attempt=completion.attempt,
            reason="the outcome could not be written; the lease will expire and the "
            "message will be delivered again",
        )

    def _log_outcome(self, c: Completion, flight: _Flight | None, now: datetime) -> None:
        metrics = self.metrics
        metrics.deliveries.labels(c.outcome).inc()
        if c.duration_ms is not None:
            metrics.attempt_seconds.observe(c.duration_ms / 1000)
        if c.state == "succeeded" and flight is not None:
            waited = (now - flight.job.created_at).total_seconds()
            metrics.commit_to_delivery_seconds.observe(max(0.0, waited))
        if c.outcome == "released":
            self.stats.released += 1
            self.log.event("released", message_id=c.id, attempt=c.attempt, sent=c.sent)
        elif c.state == "succeeded":
            self.stats.delivered += 1
            if self.log.enabled("delivered"):
                self.log.event(
                    "delivered",
                    message_id=c.id,
                    attempt=c.attempt,
                    status=c.status,
                    ms=c.duration_ms,
                    host=_host(flight),
                )
        elif c.state == "ready":
            self.stats.retried += 1
            self.log.event(
                "retried",
                message_id=c.id,
                attempt=c.attempt,
                status=c.status,
                error_class=c.error_class,
                delay_s=round(c.delay, 3),
                host=_host(flight),
            )
        else:
            self.stats.dead += 1
            self.log.event(
                "dead",
                message_id=c.id,
                attempt=c.attempt,
                status=c.status,
                error_class=c.error_class,
                error=c.error,
                host=_host(flight),
            )

    def _log_lost(self, message_id: int, attempt: int, reason: str) -> None:
        self.stats.lease_lost += 1
        self.metrics.lease_lost.inc()
        self.log.event("lease_lost", message_id=message_id, attempt=attempt, reason=reason)

    # -- leases ----------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.renew_interval)
            try:
                await self._renew()
            except Exception as exc:  # never let the heartbeat die
                self._internal_error("renew", exc)

    async def _renew(self) -> None:
        """Renew every lease held; cancel the deliveries whose lease is gone."""
        if not self._inflight:
            return
        async with self._write_lock:
            held = [(mid, f.job.attempts) for mid, f in self._inflight.items()]
            try:
                alive = await self._store.renew(self.owner, held)
            except Exception as exc:
                await self._db_error("renew", exc)
                return
            self.stats.renewals += 1
        for message_id, attempt in held:
            if message_id not in alive:
                self._lose(message_id, attempt)

    def _lose(self, message_id: int, attempt: int, reason: str = "lease not renewed") -> None:
        flight = self._inflight.pop(message_id, None)
        if flight is None:
            return
        self._pending.pop(message_id, None)
        if flight.task is not None and not flight.task.done():
            flight.task.cancel()
        self._log_lost(message_id, attempt, reason)
        self._capacity.set()

    async def _rescue_loop(self) -> None:
        while True:
            try:
                rescued = await self._store.rescue()
            except Exception as exc:
                await self._db_error("rescue", exc)
                rescued = []
            for message_id, state in rescued:
                self.stats.rescued += 1
                self.log.event("rescued", message_id=message_id, state=state)
            if rescued:
                self._wake.set()
            await asyncio.sleep(self.config.rescue_interval)

    async def _retention_loop(self) -> None:
        """Remove expired history in bounded batches, a few per interval, so that
        no statement holds locks for long and a large backlog drains gradually."""
        while True:
            await asyncio.sleep(self.config.retention_interval)
            for _ in range(20):
                try:
                    removed = await self._store.remove_history(self.config.retention_batch)
                except Exception as exc:
                    await self._db_error("retention", exc)
                    break
                self.stats.history_removed += removed
                if removed < self.config.retention_batch:
                    break
                await asyncio.sleep(0.1)  # let claims and flushes in between

    # -- shutdown ---------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Give in-flight deliveries the grace period, release the rest, record all."""
        self._shutting_down = True
        running = [
            f.task for f in self._inflight.values() if f.task is not None and not f.task.done()
        ]
        if running:
            _, late = await asyncio.wait(running, timeout=self.config.grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        deadline = asyncio.get_running_loop().time() + max(5.0, 3 * self.config.statement_timeout)
        while self._pending and asyncio.get_running_loop().time() < deadline:
            remaining = deadline - asyncio.get_running_loop().time()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._flush_pending()
        if self._pending:
            self.log.event(
                "db_error",
                operation="shutdown_flush",
                error="outcomes not recorded before exit; their leases will expire and "
                "the messages will be delivered again",
                count=len(self._pending),
            )

    # -- helpers ------------------------------------------------------------------

    async def _wait(self, event: asyncio.Event, *, seconds: float | None) -> None:
        """Wait for ``event``, at most ``seconds``. :meth:`stop` sets every event
        that is waited on, so the stop signal ends every wait too."""
        if event.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()

    def _internal_error(self, operation: str, exc: BaseException) -> None:
        self.log.event("internal_error", operation=operation, error_class=type(exc).__name__)

    async def _db_error(self, operation: str, exc: BaseException) -> None:
        self.stats.db_errors += 1
        self.metrics.db_errors.labels(operation).inc()
        self.log.event(
            "db_error",
            operation=operation,
            error_class=type(exc).__name__,
            sqlstate=getattr(exc, "sqlstate", None),
            transient=is_transient(exc),
        )

    def _note_db_error(self, operation: str, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        self.stats.db_errors += 1
        self.metrics.db_errors.labels(operation).inc()
        self.log.event(
            "db_error",
            operation=operation,
            error_class=type(exc).__name__ if exc else None,
            sqlstate=getattr(exc, "sqlstate", None),
            transient=True,
            retry=state.attempt_number,
        )


def _host(flight: _Flight | None) -> str | None:
    """The host a flight's message went to, for logs (never the path or query)."""
    return urlsplit(flight.job.url).hostname if flight else None


def run_dispatcher(
    conninfo: str,
    config: DispatcherConfig,
    *,
    drain: bool = False,
    log: EventLog | None = None,
) -> Stats:
    """Run a dispatcher on a fresh event loop (of the kind ``config.event_loop``
    names) with SIGTERM/SIGINT handlers."""

    async def main() -> Stats:
        dispatcher = Dispatcher(conninfo, config, log=log)
        dispatcher.install_signal_handlers()
        dispatcher.log.event(
            "started",
            event_loop=loops.running(),
            http_client=config.http_client,
            concurrency=config.concurrency,
        )
        return await dispatcher.run(drain=drain)

    return loops.run(main(), event_loop=config.event_loop)
