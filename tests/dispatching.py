"""Running a dispatcher in tests: fast settings, the test's database, a drain.

Every test that runs a dispatcher takes its settings from :func:`fast_config`, so
that timeouts, retries and rescues happen within seconds and loopback receivers
are allowed; a test module that needs other bounds names them as a preset (a
mapping of settings) or as overrides, next to the reason it needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from dispatchers.delivery.retry import ExponentialBackoff, Schedule
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog, NullLog
from dispatchers.store.messages import Completion
from tests.database import Db

FAST_RETRY = ExponentialBackoff(base=0.05, cap=0.1, jitter=0.0)
"""Messages are retried within a tenth of a second."""

FAST_WEBHOOK_RETRY = Schedule(delays=(0.05,), jitter=0)
"""Webhook deliveries too."""

FAST: Mapping[str, Any] = MappingProxyType(
    {
        "lease": 3.0,
        "request_timeout": 1.0,
        "connect_timeout": 0.5,
        "statement_timeout": 0.5,
        "claim_timeout": 0.5,
        "lock_timeout": 0.5,
        "poll_interval": 0.1,
        "rescue_interval": 0.2,
        "allow_private_networks": True,
        "retry_policy": FAST_RETRY,
        "webhook_retry_policy": FAST_WEBHOOK_RETRY,
        "concurrency": 8,
    }
)
"""The settings of :func:`fast_config` before presets and overrides."""


def fast_config(*presets: Mapping[str, Any], **overrides: Any) -> DispatcherConfig:
    """:data:`FAST`, updated with each of ``presets`` in turn, then ``overrides``.
    Unless they bound it, one destination may have every request slot: most tests
    send to one receiver (the bound per destination has tests of its own)."""
    settings = dict(FAST)
    for preset in presets:
        settings.update(preset)
    settings.update(overrides)
    settings.setdefault("destination_concurrency", settings["concurrency"])
    return DispatcherConfig(**settings)


async def drain(db: Db, cfg: DispatcherConfig, **kwargs: Any) -> Dispatcher:
    """Run a dispatcher on ``db`` until nothing is due or running (at most 30 s)."""
    dispatcher = Dispatcher(db.url, cfg, log=NullLog(), **kwargs)
    async with asyncio.timeout(30):
        await dispatcher.run(drain=True)
    return dispatcher


@contextlib.asynccontextmanager
async def running(
    db: Db, cfg: DispatcherConfig | None = None, *, log: EventLog | None = None
) -> AsyncIterator[Dispatcher]:
    """A dispatcher running on ``db`` in the background for the block (settings
    ``cfg``, default :func:`fast_config`), stopped at its end within 15 s."""
    dispatcher = Dispatcher(db.url, cfg or fast_config(), log=log or NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        async with asyncio.timeout(15):
            await task


async def wait_until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    """Return once ``predicate()`` holds; raise TimeoutError after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


def delivered(message_id: int, attempt: int, **fields: Any) -> Completion:
    """A 200 for ``attempt`` of ``message_id``, as a dispatcher's flush records it."""
    return Completion(
        message_id, attempt, "delivered", "delivered", sent=True, status=200,
        started_at=datetime.now(UTC), duration_ms=1, **fields,
    )  # fmt: skip


def failed(message_id: int, attempt: int, **fields: Any) -> Completion:
    """A 400 for ``attempt`` of ``message_id``: dead, its attempts left unspent."""
    return Completion(
        message_id, attempt, "dead", "failed", sent=True, status=400,
        error="HTTP 400", started_at=datetime.now(UTC), duration_ms=1, **fields,
    )  # fmt: skip


def retried(message_id: int, attempt: int, **fields: Any) -> Completion:
    """A 503 for ``attempt`` of ``message_id``, retried a minute later."""
    return Completion(
        message_id, attempt, "ready", "retry", sent=True, status=503, delay=60.0,
        error="HTTP 503", started_at=datetime.now(UTC), duration_ms=1, **fields,
    )  # fmt: skip
