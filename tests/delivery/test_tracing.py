"""OpenTelemetry end to end: the business transaction's span, the enqueue, each
delivery attempt and the receiver's server span form one trace.

Spans go to the SDK's in-memory exporter through a provider of the test's own,
given to the dispatcher and used by the receiver; the global provider is never
set, so no other test sees a span.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from outbox import Endpoints, Outbox
from outbox.receiver import extract_context
from tests.database import Db
from tests.dispatching import drain, fast_config, wait_until
from tests.docs import blocks
from tests.receiver import Received, Receiver, Reply

TRACING = "how-to/tracing.md"
"""The guide whose first Python snippet stores its span's context with its message."""


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def traceparent(context: SpanContext) -> str:
    """The W3C header of a span context: version, trace id, span id, flags."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def stored_contexts(db: Db) -> list[object]:
    return [row[0] for row in db.query("SELECT trace_context FROM outbox.messages ORDER BY id")]


async def test_one_trace_runs_from_the_business_span_to_the_receiver_across_a_retry(
    db: Db, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("shop")

    def respond(request: Received) -> Reply:
        # the receiver's work, in a server span continuing the sender's trace
        with tracer.start_as_current_span(
            "POST /hooks", context=extract_context(request.headers), kind=SpanKind.SERVER
        ):
            return Reply(503) if len(receiver.requests) == 1 else Reply(200)

    stream = io.StringIO()
    with Receiver(respond) as receiver:
        with tracer.start_as_current_span("place order") as business:
            mid = db.enqueue("order-1", f"{receiver.url}/hooks")
        dispatcher = Dispatcher(
            db.url,
            fast_config(),
            log=EventLog(stream=stream, format="json"),
            tracer_provider=provider,
        )
        task = asyncio.create_task(dispatcher.run())
        try:
            await wait_until(lambda: db.query("SELECT count(*) FROM outbox.delivered") == [(1,)])
        finally:
            dispatcher.stop()
            await task

    trace_id = business.get_span_context().trace_id
    spans = exporter.get_finished_spans()
    assert {span.context.trace_id for span in spans} == {trace_id}
    attempts = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT),
        key=lambda s: s.attributes["outbox.attempt"],  # type: ignore[index]
    )
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert [a.parent.span_id for a in attempts] == [business.get_span_context().span_id] * 2  # type: ignore[union-attr]
    # each receiver span is the child of the attempt that sent its request
    assert sorted(s.parent.span_id for s in servers) == sorted(  # type: ignore[union-attr]
        a.context.span_id for a in attempts
    )
    port = int(receiver.url.rsplit(":", 1)[1])
    common = {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": port,
        "outbox.message.id": mid,
    }
    assert [(a.name, dict(a.attributes or {})) for a in attempts] == [
        (
            "POST",
            common
            | {
                "outbox.attempt": 1,
                "outbox.outcome": "retry",
                "http.response.status_code": 503,
                "error.type": "503",
            },
        ),
        (
            "POST",
            common
            | {
                "outbox.attempt": 2,
                "outbox.outcome": "delivered",
                "http.response.status_code": 200,
            },
        ),
    ]
    assert [a.status.status_code for a in attempts] == [StatusCode.ERROR, StatusCode.UNSET]
    # the request carried the attempt's own context, not the stored one
    sent = [r.headers["traceparent"] for r in receiver.requests]
    assert sent == [traceparent(a.context) for a in attempts]
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    outcomes = [
        (x["event"], x.get("trace_id")) for x in lines if x["event"] in ("retried", "delivered")
    ]
    assert outcomes == [("retried", f"{trace_id:032x}"), ("delivered", f"{trace_id:032x}")]


async def test_publish_in_a_span_stores_its_context_for_every_endpoint(
    db: Db, provider: TracerProvider
) -> None:
    with psycopg.connect(db.url) as conn:
        for n in (1, 2):
            Endpoints().add(conn, url=f"https://hooks{n}.example.com/in")
        with provider.get_tracer("shop").start_as_current_span("pay") as span:
            Outbox().publish(conn, "order.paid", {"id": 1})
    assert stored_contexts(db) == [{"traceparent": traceparent(span.get_span_context())}] * 2


async def test_without_a_span_or_an_sdk_nothing_is_stored_or_sent(
    db: Db, receiver: Receiver
) -> None:
    # the dispatcher uses the global tracer provider, which nothing configured
    db.enqueue("untraced", f"{receiver.url}/hooks")
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url=f"{receiver.url}/events")
        Outbox().publish(conn, "order.paid", {"id": 1})
    assert stored_contexts(db) == [None, None]
    await drain(db, fast_config())
    assert [r.headers.get("traceparent") for r in receiver.wait_for(2)] == [None, None]


def test_the_tracing_guides_snippet_stores_its_span_context(database_url: str) -> None:
    snippets = [text for language, text in blocks(TRACING, "Tracing") if language == "python"]
    assert snippets, f"{TRACING} has no Python snippet"
    env = {**os.environ, "OUTBOX_DATABASE_URL": database_url}
    done = subprocess.run(
        [sys.executable, "-c", snippets[0]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "place order"' in done.stdout  # the console exporter's span
