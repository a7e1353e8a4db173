"""Fixtures of the integration tier: real PostgreSQL (see ``tests/conftest.py``)
and real HTTP on 127.0.0.1."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A directory for one test's server, outside pytest's own temporary tree: a
    server run as root drops to an unprivileged user, who must be able to reach
    it, and a concurrent pytest session makes its tree private again."""
    with tempfile.TemporaryDirectory(prefix="outbox-embedded-test-") as directory:
        yield Path(directory)
