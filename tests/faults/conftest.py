"""The fault tier: kills, freezes, restarts, cut connections, hostile receivers.

Every test here carries the ``faults`` marker, so ``-m "not faults"`` runs the
rest of the suite alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.faults)
