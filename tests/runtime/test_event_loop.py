"""The event loop a dispatcher runs on: uvloop when asked or available, asyncio's
own otherwise, and a clear error when uvloop is asked for but missing."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from dispatchers.runtime import loop as loops
from dispatchers.runtime.config import DispatcherConfig
from outbox.errors import ConfigurationError


async def kind() -> str:
    return loops.running()


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop made unimportable, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_asyncio_runs_on_asyncios_own_loop() -> None:
    assert loops.resolve("asyncio") == "asyncio"
    assert loops.run(kind(), event_loop="asyncio") == "asyncio"


def test_uvloop_runs_on_uvloop_when_asked() -> None:
    pytest.importorskip("uvloop")
    assert loops.resolve("uvloop") == "uvloop"
    assert loops.run(kind(), event_loop="uvloop") == "uvloop"


def test_auto_prefers_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert loops.run(kind(), event_loop="auto") == "uvloop"


@pytest.mark.usefixtures("without_uvloop")
def test_auto_falls_back_to_asyncio_without_uvloop() -> None:
    assert loops.resolve("auto") == "asyncio"
    assert loops.run(kind(), event_loop="auto") == "asyncio"


@pytest.mark.usefixtures("without_uvloop")
def test_uvloop_asked_for_but_missing_is_a_clear_error() -> None:
    main = kind()
    with pytest.raises(ConfigurationError, match=r"^event_loop: 'uvloop' .* cannot be imported"):
        loops.run(main, event_loop="uvloop")
    # the coroutine was closed, not left to warn that it was never awaited
    assert main.cr_frame is None


def test_an_unknown_loop_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"^event_loop: .*'trio'"):
        loops.resolve("trio")
    with pytest.raises(ConfigurationError, match=r"^event_loop: .*'trio'"):
        DispatcherConfig(event_loop="trio")
    assert DispatcherConfig().event_loop == "auto"


def test_each_run_gets_a_fresh_loop_that_is_closed_after() -> None:
    async def current() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    first = loops.run(current(), event_loop="asyncio")
    second = loops.run(current(), event_loop="asyncio")
    assert first is not second
    assert first.is_closed() and second.is_closed()


async def ignores_cancellations(times: int, ended: list[str]) -> None:
    """Lets ``times`` cancellations pass, as a call to ``asyncio.wait_for`` does on
    Python 3.11 when its awaitable finishes just as the cancellation arrives."""
    for _ in range(times):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("ended")


def test_stop_tasks_cancels_again_a_task_that_let_its_cancellation_pass() -> None:
    async def main() -> tuple[set[asyncio.Task[None]], list[str], bool]:
        ended: list[str] = []
        task = asyncio.create_task(ignores_cancellations(2, ended))
        await asyncio.sleep(0)  # in its first sleep
        left = await loops.stop_tasks([task], patience=0.01, within=30)
        return left, ended, task.cancelled()

    left, ended, cancelled = loops.run(main(), event_loop="asyncio")
    assert left == set() and ended == ["ended"] and cancelled


def test_stop_tasks_gives_up_after_its_bound_and_names_what_still_runs() -> None:
    async def main() -> tuple[bool, bool]:
        task = asyncio.create_task(ignores_cancellations(10_000, []))
        await asyncio.sleep(0)
        left = await loops.stop_tasks([task], patience=0.01, within=0.1)
        still = left == {task} and not task.done()
        task.cancel()  # the test's own clean-up: past its last ignored cancellation
        for _ in range(10_001):
            if task.done():
                break
            task.cancel()
            await asyncio.sleep(0)
        return still, task.done()

    still, done = loops.run(main(), event_loop="asyncio")
    assert still and done
