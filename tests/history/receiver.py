"""The run's receivers, in a process of their own: one HTTP server per destination
on 127.0.0.1, all on one asyncio loop, recording every request.

``python -m tests.history.receiver --config FILE --log FILE --ready FILE
[--traps FILE] [--database-url URL]``

Each destination answers as its seeded mix says (:func:`behavior`): ``ok``,
``slow`` (late but within the request timeout), ``fail`` (500), ``fail_after``
(the effect applied, then 500), ``late`` (the answer after the request timeout),
``hang`` (no answer until the client gives up), ``reset`` (a TCP reset),
``throttle`` (429 with ``Retry-After: 1``); keys starting ``poison-`` get 422,
``doomed-`` always 500, ``lapsed-`` 500 to their first two requests (the
message goes dead, and goes through once retried); a destination switched
``down`` (a line ``{"destination": NAME, "mode": "down"}`` on stdin) answers 503
until switched ``up``. A destination told to ``trap`` holds its next request
unanswered and writes its key to ``--traps``; ``release`` (with ``stop``, a pid,
or 0 for none, and ``after``, seconds) answers it as a correct receiver does,
then stops that process with SIGSTOP ``after`` seconds later (see :mod:`tests.history.fence`).
An inbox destination applies each request's effect as a correct receiver
does: ``outbox.receiver.Inbox.claim_async`` of its key and an insert into an
effects table without a unique constraint, in one transaction; it answers 2xx only
once that committed. Webhook requests have their signature verified.

The parsing is HTTP/1.1 with ``Content-Length`` (what both dispatcher clients
send), so that the times are the receiver's own: ``arrival`` once the whole
request is read; ``end`` just before the first byte of the answer is written,
when the client closes the connection (``connection_lost``), or when the receiver
gives up on a hang. One JSON line per request goes to ``--log`` when its handling
ends. SIGTERM closes every connection (a request still open ends ``shutdown``),
writes what is left and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import random
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from outbox.receiver import Inbox, InvalidSignature, idempotency_key, verify

INBOX = "history_inbox"
"""The schema of the inbox and its effects table, in the run's database."""
FAULTS = ("fail", "fail_after", "late", "hang", "reset", "throttle")
REASONS = {200: "OK", 422: "Unprocessable", 429: "Too Many", 500: "Error", 503: "Unavailable"}


@dataclass(frozen=True)
class Spec:
    """How one destination answers (from the workload, as JSON)."""

    name: str
    inbox: bool = False
    secret: str | None = None
    fault_rate: float = 0.0
    max_faults: int = 2  # per key, so that every message gets through
    weights: dict[str, float] | None = None  # of FAULTS
    slow_share: float = 0.0
    slow: tuple[float, float] = (0.05, 0.2)


def behavior(seed: int, spec: Spec, key: str, ordinal: int, faults_so_far: int) -> str:
    """What ``spec`` does with the ``ordinal``-th request of ``key`` (from 0), seeded
    per (seed, destination, key, ordinal) so that it does not depend on how the
    requests of different keys interleave."""
    if key.startswith("poison-"):
        return "poison"
    if key.startswith("doomed-"):
        return "doomed"
    if key.startswith("lapsed-") and ordinal < 2:
        return "lapsed"
    rng = random.Random(f"{seed}:{spec.name}:{key}:{ordinal}")
    if faults_so_far < spec.max_faults and rng.random() < spec.fault_rate and spec.weights:
        names = sorted(spec.weights)
        return rng.choices(names, weights=[spec.weights[n] for n in names])[0]
    return "slow" if rng.random() < spec.slow_share else "ok"


@dataclass
class Record:
    destination: str
    key: str | None
    arrival: float
    connection: int
    ordinal: int = 0
    end: float | None = None
    end_kind: str = ""
    status: int | None = None
    behavior: str = ""
    effect: str | None = None
    signature: bool | None = None

    def close(self, kind: str, status: int | None = None) -> None:
        if self.end is None:
            self.end, self.end_kind, self.status = time.time(), kind, status


class Host:
    def __init__(
        self,
        seed: int,
        specs: list[Spec],
        timeout: float,
        log: IO[str],
        traps: IO[str] | None = None,
    ) -> None:
        self.seed = seed
        self.specs = {s.name: s for s in specs}
        self.timeout = timeout
        self.log = log
        self.traps = traps
        self.down: set[str] = set()
        self.armed: set[str] = set()  # destinations whose next request is held
        self.trapped: dict[str, asyncio.Future[tuple[int, float]]] = {}
        self.seen: dict[tuple[str, str], int] = {}
        self.faulted: dict[tuple[str, str], int] = {}
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self.inbox = Inbox(schema=INBOX)
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.counter = itertools.count(1)

    def write(self, line: dict[str, Any]) -> None:
        self.log.write(json.dumps(line) + "\n")

    def control(self, change: dict[str, Any]) -> None:
        """One line of stdin: switch a destination down or up, arm its trap, or
        release the request its trap holds."""
        name, mode = change["destination"], change["mode"]
        if mode == "trap":
            self.armed.add(name)
        elif mode == "release":
            held = self.trapped.pop(name, None)
            if held is None or held.done():
                change = {**change, "missed": True}
            else:
                held.set_result((int(change["stop"]), float(change["after"])))
        else:
            (self.down.add if mode == "down" else self.down.discard)(name)
        self.write({"control": change, "at": time.time()})

    def trap(self, spec: Spec, record: Record) -> asyncio.Future[tuple[int, float]] | None:
        """Hold this request if ``spec``'s trap is armed: say so in ``--traps``;
        the future is the release (the pid to stop, and when)."""
        if spec.name not in self.armed or record.key is None or spec.name in self.down:
            return None
        self.armed.discard(spec.name)
        held: asyncio.Future[tuple[int, float]] = asyncio.get_running_loop().create_future()
        self.trapped[spec.name] = held
        self.seen[(spec.name, record.key)] = self.seen.get((spec.name, record.key), 0) + 1
        if self.traps is not None:
            line = {"destination": spec.name, "key": record.key, "arrival": record.arrival}
            self.traps.write(json.dumps(line) + "\n")
            self.traps.flush()
        return held

    def stop(self, pid: int) -> None:
        if pid <= 0:  # none named (0 would be this whole process group)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        self.write({"control": {"stopped": pid}, "at": time.time()})

    def choose(self, spec: Spec, key: str | None) -> tuple[str, int]:
        if spec.name in self.down:
            return "down", 0
        if key is None:
            return "nokey", 0
        ordinal = self.seen.get((spec.name, key), 0)
        self.seen[(spec.name, key)] = ordinal + 1
        chosen = behavior(self.seed, spec, key, ordinal, self.faulted.get((spec.name, key), 0))
        if chosen in FAULTS:
            self.faulted[(spec.name, key)] = self.faulted.get((spec.name, key), 0) + 1
        return chosen, ordinal

    async def apply(self, key: str) -> str:
        """Claim ``key`` in the inbox and apply its effect, in one transaction."""
        if self.pool is None:
            return "rejected"
        first = committing = False
        try:
            async with self.pool.connection(timeout=2.0) as conn, conn.transaction():
                first = await self.inbox.claim_async(conn, key)
                if first:
                    await conn.execute(
                        sql.SQL("INSERT INTO {} (key) VALUES (%s)").format(
                            sql.Identifier(INBOX, "effects")
                        ),
                        (key,),
                    )
                committing = True
            return "applied" if first else "duplicate"
        except (psycopg.Error, PoolTimeout, OSError):
            return "ambiguous" if committing and first else "rejected"


class Connection(asyncio.Protocol):
    """One client connection: requests in turn, one handler at a time."""

    def __init__(self, host: Host, spec: Spec) -> None:
        self.host = host
        self.spec = spec
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.current: Record | None = None
        self.closed = asyncio.Event()
        self.id = next(host.counter)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.host.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.current is not None:
            self.current.close("client_closed")
        self.closed.set()
        self.host.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        if self.current is not None or self.closed.is_set():
            return
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length") or 0)
        if len(rest) < length:
            return
        body, self.buffer = rest[:length], rest[length:]
        try:
            key = idempotency_key(headers)
        except Exception:
            key = None
        record = Record(self.spec.name, key, time.time(), self.id)
        self.current = record
        task = asyncio.get_running_loop().create_task(self._handle(record, headers, body))
        self.host.tasks.add(task)
        task.add_done_callback(self.host.tasks.discard)

    async def _handle(self, record: Record, headers: dict[str, str], body: bytes) -> None:
        try:
            await self._respond(record, headers, body)
        finally:
            record.close("client_closed" if self.closed.is_set() else "error")
            self.host.write(asdict(record))
            self.current = None
            if not self.closed.is_set():
                self._next()

    async def _respond(self, record: Record, headers: dict[str, str], body: bytes) -> None:
        spec, host = self.spec, self.host
        if spec.secret is not None:
            try:
                verify(spec.secret, headers, body)
                record.signature = True
            except InvalidSignature:
                record.signature = False
        held = host.trap(spec, record)
        if held is not None:
            await self._trapped(record, held)
            return
        chosen, record.ordinal = host.choose(spec, record.key)
        record.behavior = chosen
        if chosen in ("down", "nokey", "poison", "doomed", "lapsed", "fail", "throttle"):
            status = {"down": 503, "nokey": 400, "poison": 422, "throttle": 429}.get(chosen, 500)
            extra = {"Retry-After": "1"} if chosen == "throttle" else {}
            self._answer(record, status, extra)
            return
        if chosen == "reset":
            self._reset(record)
            return
        if chosen == "hang":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closed.wait(), 3 * host.timeout)
            record.close("receiver_closed")
            if self.transport is not None:
                self.transport.close()
            return
        if chosen == "slow":
            rng = random.Random(f"{host.seed}:{record.key}:{record.ordinal}:delay")
            await self._sleep(rng.uniform(*spec.slow))
        ok = True
        if spec.inbox and record.key is not None and not self.closed.is_set():
            record.effect = await host.apply(record.key)
            ok = record.effect in ("applied", "duplicate")
        if chosen == "fail_after":
            self._answer(record, 500)
            return
        if chosen == "late":
            await self._sleep(host.timeout + 0.3)
        self._answer(record, 200 if ok else 503)

    async def _trapped(self, record: Record, held: asyncio.Future[tuple[int, float]]) -> None:
        """Hold the request until released (or its client gives up), answer it as
        a correct receiver does, then stop the pid the release named."""
        record.behavior = "trapped"
        closed = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait(
                [held, closed], timeout=3 * self.host.timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closed.cancel()
        if not held.done() or self.closed.is_set():
            held.cancel()  # a release that comes now is missed
            record.close("receiver_closed")
            if self.transport is not None:
                self.transport.close()
            return
        pid, after = held.result()
        ok = True
        if self.spec.inbox and record.key is not None:
            record.effect = await self.host.apply(record.key)
            ok = record.effect in ("applied", "duplicate")
        self._answer(record, 200 if ok else 503)
        asyncio.get_running_loop().call_later(after, self.host.stop, pid)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closed.wait(), seconds)

    def _answer(self, record: Record, status: int, extra: dict[str, str] | None = None) -> None:
        if self.closed.is_set() or self.transport is None:
            return
        record.close("answered", status)
        body = REASONS.get(status, "?").encode()
        head = f"HTTP/1.1 {status} {REASONS.get(status, '?')}\r\nContent-Length: {len(body)}\r\n"
        head += "Content-Type: text/plain\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (extra or {}).items())
        self.transport.write(head.encode() + b"\r\n" + body)

    def _reset(self, record: Record) -> None:
        record.close("reset")
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


async def serve(
    args: argparse.Namespace, config: dict[str, Any], log: IO[str], traps: IO[str] | None = None
) -> None:
    specs = [Spec(**{**s, "slow": tuple(s.get("slow", (0.05, 0.2)))}) for s in config["specs"]]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    host = Host(config["seed"], specs, config["request_timeout"], log, traps)
    if args.database_url:
        host.pool = AsyncConnectionPool(
            args.database_url,
            min_size=1,
            max_size=8,
            open=False,
            kwargs={
                "autocommit": True,
                "connect_timeout": 2,
                "application_name": "history-receiver",
            },
        )
        await host.pool.open(wait=False)
    servers = {}
    for spec in specs:
        servers[spec.name] = await loop.create_server(
            functools.partial(Connection, host, spec), "127.0.0.1", 0
        )
    ports = {n: s.sockets[0].getsockname()[1] for n, s in servers.items()}
    partial = Path(args.ready).with_suffix(".partial")
    partial.write_text(json.dumps(ports), encoding="utf-8")
    partial.rename(args.ready)
    control = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(control), sys.stdin)

    async def controls() -> None:
        while line := await control.readline():
            host.control(json.loads(line))
            log.flush()

    async def flush() -> None:
        while True:
            await asyncio.sleep(0.25)
            log.flush()

    background = [loop.create_task(controls()), loop.create_task(flush())]
    await stop.wait()
    for server in servers.values():
        server.close()
    for conn in list(host.connections):
        if conn.current is not None:
            conn.current.close("shutdown")
        if conn.transport is not None:
            conn.transport.close()
    if host.tasks:
        await asyncio.wait(list(host.tasks), timeout=5.0)
    for task in background:
        task.cancel()
    if host.pool is not None:
        await host.pool.close(timeout=2.0)
    log.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.history.receiver")
    parser.add_argument("--config", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--traps", help="where a trapped request's key is written")
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    config = json.loads(Path(args.config).read_text(encoding="utf-8"))
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(args.log, "a", encoding="utf-8"))
        traps = stack.enter_context(open(args.traps, "a", encoding="utf-8")) if args.traps else None
        asyncio.run(serve(args, config, log, traps))
    return 0


def ensure_inbox(url: str) -> None:
    """Create the inbox and its effects table (no unique constraint: only the
    inbox dedupes) in the database at ``url``."""
    with psycopg.connect(url, application_name="history-harness") as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(INBOX)))
        Inbox(schema=INBOX).ensure_schema(conn)
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, key text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(INBOX, "effects"))
        )


if __name__ == "__main__":
    sys.exit(main())
