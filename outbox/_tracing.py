"""The trace context a message carries: read from the current span at enqueue.

OpenTelemetry is optional (extra ``otel``) and never imported here. An
application that traces has imported ``opentelemetry.trace`` to start its spans,
so when that module is not loaded no span can be active and there is nothing to
store: the check costs one dictionary lookup, and the plain install never loads
the package. Only the W3C ``traceparent`` and ``tracestate`` are stored, never
baggage, which is the application's own data.
"""

from __future__ import annotations

import json
import sys


def current_trace_context() -> str | None:
    """The W3C trace context of the current span, as the JSON object stored in
    ``messages.trace_context``, or None when no span is recording."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or not trace.get_current_span().is_recording():
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return json.dumps(carrier, separators=(",", ":"))
