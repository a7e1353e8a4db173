"""Assertions on the errors the library raises."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from outbox import InvalidArgument


@contextmanager
def invalid_argument(field: str, match: str | None = None) -> Iterator[None]:
    """Expect :class:`InvalidArgument` itself (not its subclass ``InvalidMessage``:
    the argument is not part of a message) naming ``field``."""
    with pytest.raises(InvalidArgument, match=match) as info:
        yield
    assert type(info.value) is InvalidArgument
    assert info.value.field == field
