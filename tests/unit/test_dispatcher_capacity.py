"""The dispatcher's count of requests in flight, which bounds its claims."""

from __future__ import annotations

import asyncio

from dispatchers.bench.measure import NoopClient
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from tests.jobs import job


async def test_a_delivery_lost_before_it_started_frees_its_request_slot() -> None:
    # never connects: only the in-memory bookkeeping runs
    dispatcher = Dispatcher(
        "postgresql:///unused", DispatcherConfig(), client=NoopClient(), log=NullLog()
    )
    dispatcher._start(job(id=1))
    dispatcher._start(job(id=2))
    dispatcher._lose(1, 1)  # its task is cancelled before the loop ever ran it
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert dispatcher._sending == 0
    assert dispatcher.in_flight == 1  # message 2 awaits its outcome write
    assert list(dispatcher._outcomes) == [2]
