"""The libraries' own log records (psycopg_pool's here) become events of the
dispatcher's event log: in JSON mode every line on stdout is one JSON object."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
from collections.abc import Iterator

import psycopg_pool
import pytest

from dispatchers.runtime.log import EventLog


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on (connections to it are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, EventLog]]:
    stream = io.StringIO()
    log = EventLog(stream=stream, format="json")
    handler = log.capture_logging()
    yield stream, log
    logging.getLogger().removeHandler(handler)


class Watched(io.StringIO):
    """A stream that says when a line holding ``text`` is written."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def write(self, line: str) -> int:
        if self.text in line:
            self.seen.set()
        return super().write(line)


async def test_a_pool_that_cannot_connect_logs_json_events(closed_port: int) -> None:
    stream = Watched('"logger":"psycopg.pool"')
    log = EventLog(stream=stream, format="json")
    handler = log.capture_logging()
    log.event("db_error", error="before the pool")  # an event of the dispatcher's own
    pool = psycopg_pool.AsyncConnectionPool(
        f"postgresql://outbox@127.0.0.1:{closed_port}/outbox?connect_timeout=2",
        min_size=1,
        open=False,
        reconnect_timeout=60,
    )
    try:
        await pool.open(wait=False)
        async with asyncio.timeout(20):
            await stream.seen.wait()
    finally:
        await pool.close()
        logging.getLogger().removeHandler(handler)

    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert events[0]["event"] == "db_error"
    pool_events = [e for e in events if e.get("logger") == "psycopg.pool"]
    assert pool_events[0]["event"] == "log"
    assert pool_events[0]["level"] == "warning"
    assert "error connecting" in pool_events[0]["message"]
    assert {"ts", "level", "event", "logger", "message"} <= pool_events[0].keys()


def test_records_below_the_floor_are_dropped_and_exceptions_are_one_field(
    captured: tuple[io.StringIO, EventLog],
) -> None:
    stream, _ = captured
    logger = logging.getLogger("aiohttp.client")
    logger.info("chatty")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("it failed")
    (event,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (event["level"], event["logger"], event["message"]) == (
        "error",
        "aiohttp.client",
        "it failed",
    )
    assert "ValueError: boom" in event["error"]


def test_text_mode_writes_records_as_text_lines() -> None:
    stream = io.StringIO()
    handler = EventLog(stream=stream, format="text").capture_logging()
    try:
        logging.getLogger("asyncio").warning("slow callback")
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert "WARNING" in line and "logger=asyncio message=slow callback" in line


async def test_a_pool_that_cannot_connect_writes_one_text_line_per_record(
    closed_port: int,
) -> None:
    # libpq's "connection refused" spans lines ("\n\tIs the server running ...");
    # the text log stays one line per event
    stream = Watched("logger=psycopg.pool")
    handler = EventLog(stream=stream, format="text").capture_logging()
    pool = psycopg_pool.AsyncConnectionPool(
        f"postgresql://outbox@127.0.0.1:{closed_port}/outbox?connect_timeout=2",
        min_size=1,
        open=False,
        reconnect_timeout=60,
    )
    try:
        await pool.open(wait=False)
        async with asyncio.timeout(20):
            await stream.seen.wait()
    finally:
        await pool.close()
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines, "no line written"
    for line in lines:
        assert line[:2].isdigit(), f"a line that does not start an event: {line!r}"
    assert any("error connecting" in line and "Is the server running" in line for line in lines)


def test_text_mode_writes_a_multi_line_traceback_on_its_events_line() -> None:
    stream = io.StringIO()
    handler = EventLog(stream=stream, format="text").capture_logging()
    try:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logging.getLogger("psycopg.pool").exception("first\n\tsecond")
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert "message=first second" in line
    assert "ValueError: boom second line" in line
