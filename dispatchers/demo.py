"""``outbox demo``: the whole contract, end to end, on one machine in seconds.

It publishes from business transactions (some rolled back on purpose) to a
verifying, deduplicating receiver (some deliveries failing after the effect), and
exits 0 only if every committed event's effect applied exactly once per endpoint,
nothing rolled back was sent and nothing is dead. Its own SQL is ``demo.sql``,
outside :mod:`dispatchers.store`.

Design: docs/explanation/design/demo.md
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import class_row, scalar_row

from dispatchers.delivery.retry import Schedule
from dispatchers.runtime import loop as loops
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import Outbox, migrate
from outbox.endpoints import Endpoints
from outbox.internal import Queries, catalog
from outbox.receiver import Inbox, InvalidSignature, verify

SCHEMA = "outbox_demo"
INBOX_SCHEMA = "outbox_demo_inbox"

QUERIES = Path(__file__).with_name("demo.sql")
"""The demo's tables and the statements on them (shipped in the wheel with the package)."""


def demo_queries(schema: str) -> Queries:
    """The demo's statements bound to ``schema`` (cached by the loader)."""
    return catalog(schema, (QUERIES,))


class _Effects(NamedTuple):
    """What the receiver's effects table holds at the end."""

    applied: int
    distinct_keys: int


@dataclass
class Tally:
    """What the receiver saw (filled from its threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    applied: int = 0
    duplicates: int = 0
    bad_signatures: int = 0
    failed_on_purpose: int = 0
    arrival: dict[str, float] = field(default_factory=dict)  # event key -> first arrival
    keys_seen: set[str] = field(default_factory=set)


class DemoReceiver:
    """Two webhook endpoints (/billing, /analytics) on one local HTTP server."""

    def __init__(self, database_url: str, fail_once: set[str]) -> None:
        self.database_url = database_url
        self.secrets: dict[str, str] = {}
        self.fail_once = fail_once
        self.failed: set[str] = set()
        self.tally = Tally()
        self.inbox = Inbox(schema=INBOX_SCHEMA)
        self._local = threading.local()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status = receiver.handle(self.path, dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _conn(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn: psycopg.Connection[tuple[Any, ...]] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.database_url)
            self._local.conn = conn
        return conn

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> int:
        tally = self.tally
        with tally.lock:
            tally.requests += 1
        secret = self.secrets.get(path)
        if secret is None:
            return 404
        try:
            verify(secret, headers, body)
        except InvalidSignature:
            with tally.lock:
                tally.bad_signatures += 1
            return 401
        webhook_id = next(v for k, v in headers.items() if k.lower() == "webhook-id")
        event = json.loads(body)
        conn = self._conn()
        with conn.transaction():
            first = self.inbox.claim(conn, webhook_id)
            if first:
                conn.execute(
                    demo_queries(INBOX_SCHEMA)["demo_effect_insert"].query,
                    {
                        "webhook_id": webhook_id,
                        "endpoint": path,
                        "order_id": event["data"]["order_id"],
                    },
                )
        event_key = webhook_id.rsplit(":", 1)[0]
        now = time.time()
        with tally.lock:
            tally.keys_seen.add(event_key)
            tally.arrival.setdefault(webhook_id, now)
            if first:
                tally.applied += 1
            else:
                tally.duplicates += 1
            # Fail once after the effect committed: the retry must be deduplicated.
            if event_key in self.fail_once and webhook_id not in self.failed:
                self.failed.add(webhook_id)
                tally.failed_on_purpose += 1
                return 500
        return 200

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _prepare(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for schema in (SCHEMA, INBOX_SCHEMA):
            conn.execute(demo_queries(schema)["demo_drop_schema"].query)
    migrate(database_url, schema=SCHEMA)
    with psycopg.connect(database_url) as conn:
        Inbox(schema=INBOX_SCHEMA).ensure_schema(conn)
        conn.execute(demo_queries(SCHEMA)["demo_orders_create"].query)
        conn.execute(demo_queries(INBOX_SCHEMA)["demo_effects_create"].query)


def _progress(done: int, total: int, started: float, *, final: bool = False) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    rate = done / max(time.monotonic() - started, 1e-6)
    bar = f"[{'#' * filled}{'.' * (width - filled)}]"
    line = f"  {bar} {done}/{total} delivered  {rate:,.0f}/s, paced by the publishers"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if final else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run_demo(
    database_url: str, *, events: int = 1000, rate: float = 150.0, seed: int | None = None
) -> bool:
    """Run the demo; say whether every invariant held.

    Events are published at ``rate`` per second (a steady load, so the latency
    figures mean something), each in its own business transaction.
    """
    rng = random.Random(seed)
    print(
        f"outbox demo: {events} order events, 2 webhook endpoints, published at a steady "
        f"{rate:g}/s (a paced load, not a throughput test: see `outbox bench`)",
        file=sys.stderr,
    )
    _prepare(database_url)
    keys = [f"order-{i}" for i in range(events)]
    rolled_back = {k for k in keys if rng.random() < 0.1}
    fail_once = {k for k in keys if k not in rolled_back and rng.random() < 0.05}
    receiver = DemoReceiver(database_url, fail_once)
    receiver.start()
    box = Outbox(schema=SCHEMA)
    endpoints = Endpoints(schema=SCHEMA)
    with psycopg.connect(database_url) as conn:
        billing = endpoints.add(
            conn,
            url=receiver.url + "/billing",
            event_types=["order.*"],
            description="billing service",
        )
        analytics = endpoints.add(
            conn, url=receiver.url + "/analytics", description="analytics (every event)"
        )
    receiver.secrets = {
        "/billing": billing.secrets[0].secret,
        "/analytics": analytics.secrets[0].secret,
    }
    committed_at: dict[str, float] = {}
    committed = len(keys) - len(rolled_back)
    expected = committed * 2

    def publish_all() -> None:
        start = time.monotonic()
        with psycopg.connect(database_url) as conn:
            for i, key in enumerate(keys):
                pause = start + i / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                with conn.transaction(force_rollback=key in rolled_back):
                    conn.execute(
                        demo_queries(SCHEMA)["demo_order_insert"].query,
                        {"id": i, "total": rng.randint(100, 10_000)},
                    )
                    box.publish(conn, "order.created", {"order_id": i}, idempotency_key=key)
                if key not in rolled_back:
                    committed_at[key] = time.time()

    config = DispatcherConfig(
        schema=SCHEMA,
        concurrency=32,
        allow_networks=("127.0.0.0/8",),  # the demo's own receiver; the guard stays on
        webhook_retry_policy=Schedule(delays=(0.5, 1.0, 2.0), jitter=0.1),
        poll_interval=0.2,
    )
    dispatcher = Dispatcher(database_url, config, log=NullLog())
    started = time.monotonic()

    async def main() -> None:
        task = asyncio.create_task(dispatcher.run())
        publisher = asyncio.create_task(asyncio.to_thread(publish_all))
        deadline = time.monotonic() + 60 + events / rate
        interval = 0.25 if sys.stderr.isatty() else 1.0
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(interval)
                _progress(dispatcher.stats.delivered, expected, started)
                if publisher.done() and dispatcher.stats.delivered >= expected:
                    break
        finally:
            dispatcher.stop()
            await task
            await publisher
        _progress(dispatcher.stats.delivered, expected, started, final=True)

    try:
        loops.run(main(), event_loop=config.event_loop)
    finally:
        receiver.stop()
    elapsed = time.monotonic() - started
    return _summarise(
        database_url, receiver, dispatcher, committed_at, rolled_back, expected, elapsed
    )


def _summarise(
    database_url: str,
    receiver: DemoReceiver,
    dispatcher: Dispatcher,
    committed_at: dict[str, float],
    rolled_back: set[str],
    expected: int,
    elapsed: float,
) -> bool:
    tally = receiver.tally
    with psycopg.connect(database_url) as conn:
        with conn.cursor(row_factory=class_row(_Effects)) as cur:
            effects = cur.execute(demo_queries(INBOX_SCHEMA)["demo_effects_count"].query).fetchone()
        with conn.cursor(row_factory=scalar_row) as cur:
            dead = cur.execute(demo_queries(SCHEMA)["demo_dead_count"].query).fetchone()
    effects = effects or _Effects(0, 0)
    latencies = sorted(
        (tally.arrival[wid] - committed_at[wid.rsplit(":", 1)[0]]) * 1000
        for wid in tally.arrival
        if wid.rsplit(":", 1)[0] in committed_at
    )
    leaked = tally.keys_seen & rolled_back
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = (
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        if latencies
        else float("nan")
    )
    rows = [
        ("events committed", f"{len(committed_at)}"),
        ("deliveries expected (2 endpoints)", f"{expected}"),
        ("delivered", f"{dispatcher.stats.delivered}"),
        ("retried (receiver failed once)", f"{dispatcher.stats.retried}"),
        ("duplicates suppressed by the inbox", f"{tally.duplicates}"),
        ("effects applied", f"{effects.applied}"),
        (
            "rolled back, correctly never sent",
            f"{len(rolled_back) - len(leaked)} of {len(rolled_back)}",
        ),
        ("dead", f"{dead}"),
        ("bad signatures", f"{tally.bad_signatures}"),
        ("commit-to-delivery p50", f"{p50:.1f} ms"),
        ("commit-to-delivery p99", f"{p99:.1f} ms"),
        ("elapsed", f"{elapsed:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    checks = {
        "every committed event applied exactly once per endpoint": effects.applied == expected
        and effects.distinct_keys == expected,
        "every delivery recorded as delivered": dispatcher.stats.delivered == expected,
        "no event from a rolled-back transaction was sent": not leaked,
        "no message dead": dead == 0,
        "every signature verified": tally.bad_signatures == 0,
        "every duplicate suppressed": tally.duplicates >= tally.failed_on_purpose,
    }
    ok = all(checks.values())
    for name, passed in checks.items():
        print(f"  {'ok  ' if passed else 'FAIL'} {name}")
    print("outbox demo: " + ("every invariant held" if ok else "an invariant failed"))
    return ok
