"""Waiting for a condition in async tests: polled, bounded, failing loudly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], bool], what: str, within: float = 15.0) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:g} s: {what}")
        await asyncio.sleep(0.005)
