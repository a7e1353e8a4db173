"""One OpenTelemetry span per delivery attempt, when ``opentelemetry-api`` is installed.

Each attempt gets a CLIENT span whose parent is the context stored at enqueue, and
its context goes out as ``traceparent``. The span is never made current, and
database statements get none. Without ``opentelemetry-api``, :data:`NO_SPANS`
stands in and nothing is imported.

Design: docs/explanation/design/tracing.md
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from dispatchers.delivery.jobs import Job
from dispatchers.delivery.outcome import Outcome, Verdict

if TYPE_CHECKING:
    from opentelemetry.trace import Span

TRACER_NAME = "outbox.dispatchers"


class AttemptSpan(Protocol):
    """The span of one attempt, ended once with its outcome."""

    @property
    def trace_id(self) -> str | None:
        """The attempt's trace id (32 hex digits), or None when it has none."""
        ...

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        """Add the span's ``traceparent`` (and ``tracestate``) to ``headers``."""
        ...

    def end(self, outcome: Outcome | None) -> None:
        """End the span with ``outcome`` (None: the attempt was cancelled)."""
        ...


class AttemptSpans(Protocol):
    """Starts the span of each attempt."""

    def start(self, job: Job) -> AttemptSpan: ...


class _Untraced:
    """An attempt without a span; its trace id is the stored context's, if any."""

    __slots__ = ("trace_id",)

    def __init__(self, trace_id: str | None) -> None:
        self.trace_id = trace_id

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        return headers

    def end(self, outcome: Outcome | None) -> None:
        pass


class _NoSpans:
    def start(self, job: Job) -> AttemptSpan:
        return _Untraced(stored_trace_id(job.trace_context))


NO_SPANS: AttemptSpans = _NoSpans()
"""Attempts without spans: when ``opentelemetry-api`` is not installed."""


def stored_trace_id(trace_context: dict[str, str] | None) -> str | None:
    """The trace id of a stored W3C context (``version-traceid-spanid-flags``)."""
    if not trace_context:
        return None
    parts = trace_context.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def attempt_spans(tracer_provider: Any = None) -> AttemptSpans:
    """Spans from ``tracer_provider`` (an OpenTelemetry ``TracerProvider``; None:
    the global one), or :data:`NO_SPANS` when OpenTelemetry is not installed."""
    if tracer_provider is None and importlib.util.find_spec("opentelemetry") is None:
        return NO_SPANS
    return _OpenTelemetrySpans(tracer_provider)


class _OpenTelemetrySpans:
    def __init__(self, tracer_provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._proxied = isinstance(self._tracer, trace.ProxyTracer)
        self._noop = isinstance(self._tracer, trace.NoOpTracer)
        self._provider = trace.get_tracer_provider
        self._proxy = trace.ProxyTracerProvider
        self.propagator = TraceContextTextMapPropagator()
        self.in_context = trace.set_span_in_context
        self.error = trace.StatusCode.ERROR
        self._root = Context()
        self._client = trace.SpanKind.CLIENT

    def recording(self) -> bool:
        """Whether a span started now may record: not while the tracer is a no-op
        (a global one that no provider has been set for yet follows one once set)."""
        if self._proxied:
            return not isinstance(self._provider(), self._proxy)
        return not self._noop

    def start(self, job: Job) -> AttemptSpan:
        if not self.recording():
            # a no-op tracer's span is its parent's, attributes unread: without
            # a stored context, an invalid one, which injects nothing
            if not job.trace_context:
                return _Untraced(None)
            parent = self.propagator.extract(job.trace_context, context=self._root)
            return _OpenTelemetrySpan(self, self._tracer.start_span(job.method, context=parent))
        # extracted into an empty context: without a stored one the span is a root
        parent = self.propagator.extract(job.trace_context or {}, context=self._root)
        url = urlsplit(job.url)
        attributes: dict[str, str | int] = {
            "http.request.method": job.method,
            "server.address": url.hostname or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "outbox.message.id": job.id,
            "outbox.attempt": job.attempts,
        }
        if job.endpoint_id is not None:
            attributes["outbox.endpoint.id"] = job.endpoint_id
        span = self._tracer.start_span(
            job.method, context=parent, kind=self._client, attributes=attributes
        )
        return _OpenTelemetrySpan(self, span)


class _OpenTelemetrySpan:
    __slots__ = ("_span", "_spans")

    def __init__(self, spans: _OpenTelemetrySpans, span: Span) -> None:
        self._spans = spans
        self._span = span

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        spans = self._spans
        spans.propagator.inject(headers, context=spans.in_context(self._span))
        return headers

    @property
    def trace_id(self) -> str | None:
        context = self._span.get_span_context()
        return f"{context.trace_id:032x}" if context.is_valid else None

    def end(self, outcome: Outcome | None) -> None:
        span = self._span
        if outcome is None:
            span.set_attribute("error.type", "cancelled")
            span.set_status(self._spans.error, "cancelled")
        else:
            span.set_attribute("outbox.outcome", str(outcome.verdict))
            if outcome.status is not None:
                span.set_attribute("http.response.status_code", outcome.status)
            if outcome.verdict is not Verdict.DELIVERED:
                # the status code as text for an HTTP error, else the error's class
                error_type = (
                    str(outcome.status)
                    if outcome.status is not None and outcome.status >= 400
                    else outcome.error_class or "_OTHER"
                )
                span.set_attribute("error.type", error_type)
                span.set_status(self._spans.error, outcome.error)
        span.end()
