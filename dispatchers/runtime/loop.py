"""The event loop a dispatcher runs on: asyncio's own, or uvloop's where installed.

Much of a dispatcher's CPU per HTTP delivery is the event loop and the socket work
under the HTTP client, and uvloop (libuv, in C) does that work for less: 5 to 9%
less dispatcher CPU per message in ``outbox bench --scenario drain-http`` (four
runs of 4 to 6 drains per loop, alternated; ``--event-loop``), 11% less on the
sending path alone. It is an optional dependency (``pip install 'pg-outbox[fast]'``;
not on Windows), so ``"auto"``, the default, uses it when it can be imported and
asyncio's loop otherwise; ``"uvloop"`` insists on it.

Loops are made by :class:`asyncio.Runner` with a loop factory, never through an
event loop policy (deprecated from Python 3.14).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
from collections.abc import Callable, Collection, Coroutine
from typing import Any, TypeVar

from outbox.errors import ConfigurationError

EVENT_LOOPS = ("auto", "asyncio", "uvloop")
"""The names ``DispatcherConfig.event_loop`` and ``--event-loop`` accept."""

T = TypeVar("T")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def resolve(name: str) -> str:
    """The loop ``name`` stands for here: ``"asyncio"`` or ``"uvloop"``.

    Raises ConfigurationError for an unknown name, or for ``"uvloop"`` when it
    cannot be imported.
    """
    if name not in EVENT_LOOPS:
        raise ConfigurationError(
            f"event_loop: must be one of {', '.join(map(repr, EVENT_LOOPS))}, got {name!r}"
        )
    if name == "asyncio":
        return "asyncio"
    if _uvloop_factory() is not None:
        return "uvloop"
    if name == "uvloop":
        raise ConfigurationError(
            "event_loop: 'uvloop' was asked for but cannot be imported; install it "
            "(pip install 'pg-outbox[fast]') or choose 'auto' or 'asyncio'"
        )
    return "asyncio"


async def stop_tasks(
    tasks: Collection[asyncio.Task[Any]], *, patience: float = 0.5, within: float = 30.0
) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` and wait until every one has ended; return those still
    running after ``within`` seconds (none, unless one ignores cancellation).

    One cancellation is not always enough: on Python 3.11, :func:`asyncio.wait_for`
    (which psycopg_pool waits for a connection with) returns its result when the
    awaited call finishes just as the cancellation arrives, and the task goes on as
    if never cancelled. So a task still running ``patience`` seconds after its
    cancellation is cancelled again. Each exception is retrieved (they were
    reported where they happened).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(patience, left))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()
    return pending


def loop_factory(name: str) -> LoopFactory | None:
    """The factory of the loop ``name`` stands for (see :func:`resolve`); None for
    asyncio's default loop."""
    if resolve(name) == "uvloop":
        return _uvloop_factory()
    return None


def run(main: Coroutine[Any, Any, T], *, event_loop: str = "auto") -> T:
    """Run ``main`` to completion on a fresh loop of the kind ``event_loop`` names,
    as :func:`asyncio.run` does (the loop is closed afterwards)."""
    try:
        factory = loop_factory(event_loop)
    except BaseException:
        main.close()  # never awaited: close it, or Python warns about it
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def freeze_heap() -> None:
    """Collect once, then leave every object alive now to the collector's
    permanent generation (:func:`gc.freeze`): the modules, classes and settings a
    process made to start are never garbage, yet each full collection walked them
    all, as deliveries' short-lived objects kept triggering one (about 20 us of
    dispatcher CPU per message in ``outbox bench --scenario drain-http``). For a
    process that only dispatches: what it runs on afterwards is collected as before."""
    gc.collect()
    gc.freeze()


def running() -> str:
    """The kind of the running loop: ``"uvloop"`` or ``"asyncio"``."""
    kind = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    return "uvloop" if kind == "uvloop" else "asyncio"


def _uvloop_factory() -> LoopFactory | None:
    try:
        module = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: LoopFactory = module.new_event_loop
    return factory
