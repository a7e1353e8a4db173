"""Event logs: one JSON object per line on stdout, or text for a terminal.

Events carry ids, attempt numbers, statuses, error classes and hosts, never
payloads, headers, full URLs (their query strings may hold tokens) or secrets.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

# Events per delivery are info; trouble is warning or error.
EVENT_LEVELS = {
    "claimed": "debug",
    "delivered": "info",
    "retried": "info",
    "dead": "warning",
    "lease_lost": "warning",
    "released": "info",
    "rescued": "warning",
    "db_error": "error",
    "failed": "error",
    "internal_error": "error",
    "outcome_dropped": "error",
    "endpoint_disabled": "warning",
    "listen_error": "warning",
}


class EventLog:
    """Writes events as JSON lines (``format="json"``) or readable text."""

    def __init__(
        self, *, stream: TextIO | None = None, format: str | None = None, level: str = "info"
    ) -> None:
        self.stream = stream or sys.stdout
        if format is None:
            format = "text" if self.stream.isatty() else "json"
        if format not in ("json", "text"):
            raise ValueError(f"log format must be json or text, not {format!r}")
        if level not in LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LEVELS)}")
        self.format = format
        self.threshold = LEVELS[level]

    def enabled(self, event: str) -> bool:
        return LEVELS[EVENT_LEVELS.get(event, "info")] >= self.threshold

    def event(self, event: str, **fields: Any) -> None:
        level = EVENT_LEVELS.get(event, "info")
        if LEVELS[level] < self.threshold:
            return
        now = datetime.now(UTC)
        if self.format == "json":
            record = {"ts": now.isoformat(timespec="milliseconds"), "level": level, "event": event}
            record.update(fields)
            line = json.dumps(record, default=str, separators=(",", ":"))
        else:
            details = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            line = f"{now:%H:%M:%S} {level.upper():7} {event:11} {details}"
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass


class NullLog(EventLog):
    """Discards every event (for embedding a dispatcher in tests or benchmarks)."""

    def __init__(self) -> None:
        self.format = "json"
        self.threshold = 100
        self.stream = sys.stdout

    def event(self, event: str, **fields: Any) -> None:
        return None
