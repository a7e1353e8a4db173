"""The event loop a dispatcher runs on: uvloop when asked or available, asyncio's
own otherwise, and a clear error when uvloop is asked for but missing."""

from __future__ import annotations

import asyncio
import sys

import pytest

from dispatchers import loop as loops
from dispatchers.config import DispatcherConfig
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
