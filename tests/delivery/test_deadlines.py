"""One timer for every attempt in flight: overdue tasks are cancelled at their
deadline, a cancellation from elsewhere is never taken for a timeout, and nothing
is left scheduled once no attempt is.

Each test runs on asyncio's loop and on uvloop's (its clock and timers have
millisecond resolution)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dispatchers.delivery.deadline import Deadlines
from dispatchers.runtime import loop as loops
from tests.timing import LATE

Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    if request.param == "uvloop":
        pytest.importorskip("uvloop")

    def run(main: Coroutine[Any, Any, Any]) -> Any:
        return loops.run(main, event_loop=request.param)

    return run


async def bounded(deadlines: Deadlines, work: Coroutine[Any, Any, Any]) -> str:
    """Run ``work`` under ``deadlines`` as the sender does; say how it ended."""
    task = asyncio.current_task()
    assert task is not None
    deadlines.add(task)
    try:
        await work
    except asyncio.CancelledError:
        if not deadlines.expired(task):
            raise
        return "timed out"
    finally:
        deadlines.discard(task)
    return "finished"


def test_an_attempt_that_never_ends_is_cancelled_at_its_deadline(run: Run) -> None:
    async def main() -> tuple[str, float, int, bool]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(0.2)
        started = loop.time()
        async with asyncio.timeout(10):  # the bound under test failing must not hang
            result = await bounded(deadlines, asyncio.Event().wait())
        return result, loop.time() - started, len(deadlines), deadlines.armed

    result, elapsed, left, armed = run(main())
    assert result == "timed out"
    assert 0.2 - 0.01 <= elapsed < 0.2 + LATE
    assert (left, armed) == (0, False)


@pytest.mark.slow
def test_attempts_are_cut_each_at_its_own_deadline(run: Run) -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(1.0)

        async def one(delay: float, work: float) -> tuple[str, float]:
            await asyncio.sleep(delay)
            begun = loop.time()
            result = await bounded(deadlines, asyncio.sleep(work))
            return result, loop.time() - begun

        async with asyncio.timeout(1.0 + LATE + 5):
            results = await asyncio.gather(
                one(0.0, 30), one(0.1, 0.05), one(0.15, 30), one(0.2, 0.1)
            )
        assert (len(deadlines), deadlines.armed) == (0, False)
        return results

    (a, a_took), (b, b_took), (c, c_took), (d, d_took) = run(main())
    assert (a, b, c, d) == ("timed out", "finished", "timed out", "finished")
    # each cut at its own 1 s, however late; the others finished well within theirs
    assert 1.0 - 0.01 <= a_took < 1.0 + LATE and 1.0 - 0.01 <= c_took < 1.0 + LATE
    assert b_took < 1.0 and d_took < 1.0


def test_attempts_that_finish_in_time_leave_no_timer_behind(run: Run) -> None:
    async def main() -> list[tuple[int, bool]]:
        deadlines = Deadlines(30.0)
        seen = []
        for _ in range(3):
            results = await asyncio.gather(
                *(bounded(deadlines, asyncio.sleep(0.001 * i)) for i in range(20))
            )
            assert results == ["finished"] * 20
            seen.append((len(deadlines), deadlines.armed))
        return seen

    assert run(main()) == [(0, False)] * 3


def test_a_cancellation_from_elsewhere_propagates_and_leaves_no_timer(run: Run) -> None:
    async def main() -> tuple[bool, int, bool]:
        deadlines = Deadlines(30.0)
        task = asyncio.create_task(bounded(deadlines, asyncio.Event().wait()))
        await asyncio.sleep(0.05)
        assert (len(deadlines), deadlines.armed) == (1, True)
        task.cancel()  # a lost lease, a shutdown
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled(), len(deadlines), deadlines.armed

    assert run(main()) == (True, 0, False)


def test_a_cancellation_from_elsewhere_at_the_deadline_is_not_swallowed(run: Run) -> None:
    async def main() -> bool:
        deadlines = Deadlines(0.1)
        loop = asyncio.get_running_loop()

        async def work() -> None:
            # Cancelled by someone else at its deadline: scheduled in the step that
            # registered the deadline, from the same clock reading (uvloop's is
            # read once per iteration), so both fire in the same loop iteration.
            loop.call_at(loop.time() + 0.1, task.cancel)
            await asyncio.Event().wait()

        task = asyncio.create_task(bounded(deadlines, work()))
        async with asyncio.timeout(10):
            with pytest.raises(asyncio.CancelledError):
                await task
        return task.cancelled()

    assert run(main()) is True


def test_a_task_that_lives_on_after_a_timeout_is_not_cancelled_again(run: Run) -> None:
    async def main() -> tuple[str, str, int]:
        deadlines = Deadlines(0.1)

        async def two_attempts() -> tuple[str, str]:
            first = await bounded(deadlines, asyncio.Event().wait())
            second = await bounded(deadlines, asyncio.sleep(0.05))
            await asyncio.sleep(0.2)  # past where the first deadline was: nothing fires
            return first, second

        task = asyncio.current_task()
        assert task is not None
        async with asyncio.timeout(10):
            first, second = await two_attempts()
        return first, second, task.cancelling()

    assert run(main()) == ("timed out", "finished", 0)
