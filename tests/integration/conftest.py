"""Fixtures of the integration tier: real PostgreSQL (see ``tests/conftest.py``)
and real HTTP on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.receiver import Receiver
from tests.transactions import Observer


@pytest.fixture
def observer(database_url: str) -> Iterator[Observer]:
    """A separate autocommit connection: sees committed rows only."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP receiver on 127.0.0.1 that answers 200 unless told otherwise."""
    with Receiver() as r:
        yield r
