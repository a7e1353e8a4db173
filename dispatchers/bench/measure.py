"""The arithmetic and probes the scenarios share: medians and percentiles, CPU per
message, ratios, this process's memory, fresh planner statistics, an HTTP client that
answers without a network (so a drain times the queue alone), and a tracer
provider that records spans and drops them."""

from __future__ import annotations

import resource
import ssl
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dispatchers.bench.env import bench_queries, connect

MB = 1_000_000


def median(values: list[float | None]) -> float | None:
    """The median of the values present, or None when there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def most(values: list[float | None]) -> float | None:
    """The largest of the values present, or None when there are none."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def delta(after: float | None, before: float | None) -> float | None:
    """``after - before`` of two clock readings, None when either is missing."""
    return None if after is None or before is None else after - before


def per_msg_us(seconds: float | None, count: int) -> float | None:
    """``seconds`` spread over ``count`` messages, in microseconds each."""
    return None if seconds is None or not count else seconds * 1e6 / count


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs``, None when either is missing or ``theirs`` is 0."""
    return ours / theirs if ours is not None and theirs else None


def rss_now() -> int | None:
    """This process's resident set size in bytes, or None where ``/proc`` is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def peak_rss() -> int:
    """This process's peak resident set size in bytes (``ru_maxrss`` is in KiB on
    Linux, in bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def analyze(url: str, schema: str) -> None:
    """Fresh planner statistics for the outbox tables (as autovacuum would give)."""
    with connect(url, autocommit=True) as conn:
        conn.execute(bench_queries(schema)["analyze_outbox"])


class NoopClient:
    """An :class:`~dispatchers.delivery.http.HttpClient` that answers 200 to every request
    without a network, and counts the requests."""

    def __init__(self) -> None:
        self.requests = 0

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        read_limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        self.requests += 1
        return 200, {}, b""

    async def aclose(self) -> None:
        return None


def recording_tracer_provider() -> Any:
    """An OpenTelemetry SDK tracer provider whose spans are recorded and handed in
    batches, as a production set-up does, to an exporter that drops them: the
    dispatcher's cost of tracing, without a collector's. Needs opentelemetry-sdk."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    return provider
