"""The outcome buffer: written in batches, on size or on time, nothing lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from dispatchers.runtime import flusher as flusher_module
from dispatchers.runtime.flusher import Flusher
from tests.timing import LATE


@dataclass(frozen=True)
class Item:
    key: int
    version: int = 0


@dataclass
class Writes:
    """A write callback that records its batches; ``fail`` makes the next calls raise."""

    batches: list[list[Item]] = field(default_factory=list)
    fail: int = 0
    during: Callable[[], None] | None = None  # runs inside the next write
    written: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, batch: list[Item]) -> None:
        await asyncio.sleep(0)  # a write yields, as a statement does
        if self.during is not None:
            during, self.during = self.during, None
            during()
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the write failed")
        self.batches.append(batch)
        self.written.set()


def buffer(
    writes: Writes,
    *,
    size: int = 3,
    interval: float = 0.05,
    batch: int = 10,
    errors: list[BaseException] | None = None,
) -> Flusher[Item]:
    return Flusher(
        writes,
        size=size,
        interval=interval,
        batch=batch,
        on_error=(errors if errors is not None else []).append,
    )


@asynccontextmanager
async def running(flusher: Flusher[Item]) -> AsyncIterator[None]:
    task = asyncio.create_task(flusher.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def add(flusher: Flusher[Item], *items: Item) -> None:
    for item in items:
        flusher.add(item.key, item)


async def test_a_full_batch_is_written_without_waiting_for_the_interval() -> None:
    writes = Writes()
    flusher = buffer(writes, size=3, interval=30.0)
    async with running(flusher):
        add(flusher, Item(1), Item(2), Item(3))
        async with asyncio.timeout(5):
            await writes.written.wait()
    assert writes.batches == [[Item(1), Item(2), Item(3)]]
    assert len(flusher) == 0


async def test_a_few_items_are_written_after_the_interval() -> None:
    writes = Writes()
    flusher = buffer(writes, size=100, interval=0.1)
    async with running(flusher):
        started = time.monotonic()
        add(flusher, Item(1))
        async with asyncio.timeout(10):
            await writes.written.wait()
        waited = time.monotonic() - started
    assert writes.batches == [[Item(1)]]
    assert 0.1 - 0.01 <= waited < 0.1 + LATE  # the interval, nothing sooner, wrote it


async def test_flush_soon_writes_before_the_interval() -> None:
    writes = Writes()
    flusher = buffer(writes, size=100, interval=30.0)
    async with running(flusher):
        add(flusher, Item(1))
        flusher.flush_soon()
        async with asyncio.timeout(5):
            await writes.written.wait()
    assert writes.batches == [[Item(1)]]


async def test_a_newer_item_replaces_the_one_waiting_for_its_key() -> None:
    writes = Writes()
    flusher = buffer(writes)
    add(flusher, Item(1), Item(2), Item(1, version=1))
    await flusher.flush()
    assert writes.batches == [[Item(1, version=1), Item(2)]]


async def test_flush_writes_everything_in_batches_of_the_given_size() -> None:
    writes = Writes()
    flusher = buffer(writes, batch=2)
    add(flusher, *(Item(k) for k in range(5)))
    await flusher.flush()
    assert [[i.key for i in b] for b in writes.batches] == [[0, 1], [2, 3], [4]]
    assert list(flusher) == []


async def test_an_item_replaced_while_its_batch_is_written_stays_held() -> None:
    writes = Writes()
    flusher = buffer(writes, batch=1)
    add(flusher, Item(1))
    # the newer item arrives while the older one is being written: both are written
    writes.during = lambda: add(flusher, Item(1, version=1))
    await flusher.flush()
    assert writes.batches == [[Item(1)], [Item(1, version=1)]]


async def test_discard_removes_only_the_item_named() -> None:
    flusher = buffer(Writes())
    held = Item(1)
    add(flusher, held, Item(2))
    flusher.discard(1, Item(1))  # equal, but not the item held: kept
    flusher.discard(2)
    assert list(flusher) == [1]
    flusher.discard(1, held)
    assert len(flusher) == 0


async def test_a_failed_write_keeps_the_items_and_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flusher_module, "ERROR_PAUSE", 0.01)
    writes = Writes(fail=2)
    errors: list[BaseException] = []
    flusher = buffer(writes, size=1, errors=errors)
    async with running(flusher):
        add(flusher, Item(1))
        async with asyncio.timeout(5):
            await writes.written.wait()
    assert writes.batches == [[Item(1)]]
    assert [str(e) for e in errors] == ["the write failed"] * 2
    assert len(flusher) == 0
