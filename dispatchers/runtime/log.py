"""Event logs: one JSON object per line on stdout, or text for a terminal.

Events carry ids, attempt numbers, statuses, error classes and hosts, never
payloads, headers, full URLs (their query strings may hold tokens) or secrets.
The libraries' own records (psycopg_pool's, asyncio's, aiohttp's, through Python's
:mod:`logging`) become ``log`` events of the same log
(:meth:`EventLog.capture_logging`), so every line is one event in either format.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Mapping
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
    "shutdown_abandoned": "warning",
    "endpoint_disabled": "warning",
    "listen_error": "warning",
    "secrets_unavailable": "error",
    "breaker_opened": "warning",
    "breaker_probing": "info",
    "breaker_closed": "info",
    "breaker_reopened": "warning",
    "breaker_probe_returned": "info",
    "destination_held": "warning",
    "destination_blocked": "error",
    "reconnected": "info",
    "lag_exceeded": "warning",
    "lag_recovered": "info",
    "database_restarting": "warning",
    "fleet_failed": "error",
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
        self.write(EVENT_LEVELS.get(event, "info"), event, fields)

    def write(self, level: str, event: str, fields: Mapping[str, Any]) -> None:
        """Write ``event`` at ``level`` (one of :data:`LEVELS`) unless it is below
        the log's threshold."""
        if LEVELS[level] < self.threshold:
            return
        now = datetime.now(UTC)
        if self.format == "json":
            record = {"ts": now.isoformat(timespec="milliseconds"), "level": level, "event": event}
            record.update(fields)
            line = json.dumps(record, default=str, separators=(",", ":"))
        else:
            # one line per event, whatever a value holds (libpq's messages and
            # tracebacks span lines)
            details = " ".join(f"{k}={_one_line(v)}" for k, v in fields.items() if v is not None)
            line = f"{now:%H:%M:%S} {level.upper():7} {event:11} {details}"
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass

    def labelled(self, **fields: Any) -> EventLog:
        """This log with ``fields`` first in every event: a process serving several
        databases writes each one's events with its ``database`` label."""
        return _Labelled(self, fields)

    def capture_logging(self) -> logging.Handler:
        """Write every record of Python's logging at warning or above (or at the
        log's level, if higher) as a ``log`` event here; return the handler, which
        the root logger keeps until it is removed.

        For a process's entry point, which owns its output: the root logger's level
        is set, its records no longer reach stderr as plain text, and a log that
        captured them before stops doing so.
        """
        handler = _Records(self)
        root = logging.getLogger()
        for earlier in [h for h in root.handlers if isinstance(h, _Records)]:
            root.removeHandler(earlier)
        root.setLevel(max(logging.WARNING, self.threshold))
        root.addHandler(handler)
        return handler


class _Labelled(EventLog):
    """An :class:`EventLog` that writes through another, adding fields of its own."""

    def __init__(self, parent: EventLog, fields: Mapping[str, Any]) -> None:
        self.stream = parent.stream
        self.format = parent.format
        self.threshold = parent.threshold
        self._parent = parent
        self._fields = dict(fields)

    def write(self, level: str, event: str, fields: Mapping[str, Any]) -> None:
        self._parent.write(level, event, {**self._fields, **fields})


class _Records(logging.Handler):
    """Writes the records of Python's logging as ``log`` events of an EventLog:
    the logger's name, the message, and the exception (formatted) if any."""

    def __init__(self, log: EventLog) -> None:
        super().__init__()
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {
                "logger": record.name,
                "message": _one_line(record.getMessage()),
            }
            if record.exc_info and record.exc_info[1] is not None:
                fields["error"] = "".join(traceback.format_exception(record.exc_info[1]))
            self._log.write(_level_of(record.levelno), "log", fields)
        except Exception:
            self.handleError(record)


def _one_line(value: object) -> str:
    """``value`` as text on one line: every run of whitespace, line breaks
    included, made one space."""
    return " ".join(str(value).split())


def _level_of(levelno: int) -> str:
    """The event level of a logging level (critical is error)."""
    for name in ("error", "warning", "info"):
        if levelno >= LEVELS[name]:
            return name
    return "debug"


class NullLog(EventLog):
    """Discards every event (for embedding a dispatcher in tests or benchmarks)."""

    def __init__(self) -> None:
        self.format = "json"
        self.threshold = 100
        self.stream = sys.stdout

    def event(self, event: str, **fields: Any) -> None:
        return None
