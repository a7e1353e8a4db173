"""The soak's verdict: when a figure counts as flat after the warm-up."""

from __future__ import annotations

import pytest

from dispatchers.bench.soak import FLAT_RATIO, trend


def test_a_figure_is_flat_when_its_later_peak_stays_near_the_warmup_peak() -> None:
    values: list[float | None] = [60.0, 61.0, 62.0, 61.0, 62.0, 63.0, 60.0, 61.0, 62.0]
    result = trend(values, slack=1.0)
    assert result.warmup_intervals == 3
    assert result.warmup_peak == 62.0
    assert result.later_peak == 63.0
    assert result.flat is True


def test_a_figure_that_keeps_growing_is_not_flat() -> None:
    values: list[float | None] = [10.0 * (1 + k / 10) for k in range(9)]
    result = trend(values, slack=0.5)
    assert result.warmup_peak == pytest.approx(12.0)
    assert result.later_peak == pytest.approx(18.0)
    assert result.later_peak > result.warmup_peak * FLAT_RATIO + 0.5
    assert result.flat is False


def test_the_verdict_stays_open_when_the_run_is_too_short() -> None:
    assert trend([50.0], slack=1.0).flat is None
    assert trend([None, None, None], slack=1.0).flat is None
    assert trend([50.0, 80.0], slack=1.0).flat is False
