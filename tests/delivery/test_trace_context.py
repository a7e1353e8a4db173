"""The trace context read at enqueue, and each attempt's span, without I/O."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dispatchers.delivery.outcome import Outcome, Verdict
from dispatchers.delivery.tracing import NO_SPANS, attempt_spans, stored_trace_id
from outbox._tracing import current_trace_context
from tests.jobs import job

TIMEOUT = Outcome(Verdict.RETRY, None, "no complete response within 1 s", "timeout", None)
STORED = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def test_nothing_is_stored_without_a_recording_span(provider: TracerProvider) -> None:
    assert current_trace_context() is None
    with provider.get_tracer("t").start_as_current_span("order") as span:
        stored = current_trace_context()
    assert stored is not None
    assert json.loads(stored)["traceparent"].split("-")[1] == f"{span.context.trace_id:032x}"


def test_an_attempt_without_stored_context_is_a_root_span_and_sends_its_own(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with provider.get_tracer("t").start_as_current_span("unrelated"):
        span = attempt_spans(provider).start(job(url="https://example.com:8443/hook"))
        headers = span.inject({})
    span.end(TIMEOUT)
    (finished,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert finished.parent is None
    assert headers["traceparent"].split("-")[2] == f"{finished.context.span_id:016x}"
    assert span.trace_id == f"{finished.context.trace_id:032x}"
    assert finished.attributes is not None
    assert finished.attributes["server.port"] == 8443
    assert finished.attributes["error.type"] == "timeout"
    assert finished.status.status_code is StatusCode.ERROR


def test_a_cancelled_attempt_ends_its_span_in_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    attempt_spans(provider).start(job(trace_context=STORED)).end(None)
    (finished,) = exporter.get_finished_spans()
    assert f"{finished.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert finished.attributes is not None
    assert finished.attributes["error.type"] == "cancelled"


def test_without_spans_the_trace_id_is_the_stored_one() -> None:
    span = NO_SPANS.start(job(trace_context=STORED))
    assert span.inject({"a": "b"}) == {"a": "b"}
    assert span.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert NO_SPANS.start(job()).trace_id is None
    assert stored_trace_id({"traceparent": "garbage"}) is None


def test_with_a_no_op_tracer_an_attempt_passes_its_stored_context_on_and_records_nothing() -> None:
    from opentelemetry.trace import NoOpTracerProvider

    spans = attempt_spans(NoOpTracerProvider())
    untraced = spans.start(job())
    assert untraced.inject({"a": "b"}) == {"a": "b"}
    assert untraced.trace_id is None
    untraced.end(TIMEOUT)
    stored = spans.start(job(trace_context=STORED))
    assert stored.inject({}) == STORED
    assert stored.trace_id == "0af7651916cd43dd8448eb211c80319c"
    stored.end(TIMEOUT)
