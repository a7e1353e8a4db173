"""The dispatcher's count of requests in flight, which bounds its claims."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime

from dispatchers.config import DispatcherConfig
from dispatchers.db import Job
from dispatchers.log import NullLog
from dispatchers.pool import Dispatcher


class Answers200:
    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, Mapping[str, str], bytes]:
        return 200, {}, b""

    async def aclose(self) -> None:
        return None


def job(message_id: int) -> Job:
    return Job(
        id=message_id,
        idempotency_key=f"k{message_id}",
        url="https://example.com/hook",
        method="POST",
        headers={},
        body=b"{}",
        content_type="application/json",
        attempts=1,
        max_attempts=3,
        endpoint_id=None,
        event_type=None,
        created_at=datetime.now(UTC),
    )


async def test_a_delivery_lost_before_it_started_frees_its_request_slot() -> None:
    # never connects: only the in-memory bookkeeping runs
    dispatcher = Dispatcher("postgresql:///unused", DispatcherConfig(), client=Answers200())
    dispatcher.log = NullLog()
    dispatcher._start(job(1))
    dispatcher._start(job(2))
    dispatcher._lose(1, 1)  # its task is cancelled before the loop ever ran it
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert dispatcher._sending == 0
    assert dispatcher.in_flight == 1  # message 2 awaits its outcome write
    assert list(dispatcher._pending) == [2]
