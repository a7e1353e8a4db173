"""The pause before trying the database again after an error."""

from __future__ import annotations

from typing import Any

import pytest

from dispatchers.runtime.backoff import Backoff


def test_each_failure_doubles_the_pause_up_to_the_maximum() -> None:
    backoff = Backoff(initial=0.05, maximum=1.0, jitter=0)
    assert [backoff.next() for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_success_starts_over() -> None:
    backoff = Backoff(initial=0.5, maximum=10.0, jitter=0)
    backoff.next()
    backoff.next()
    backoff.reset()
    assert backoff.next() == 0.5


def test_jitter_only_shortens_the_pause_by_at_most_its_fraction() -> None:
    longest = Backoff(initial=1.0, maximum=8.0, jitter=0.5, random=lambda: 0.0)
    shortest = Backoff(initial=1.0, maximum=8.0, jitter=0.5, random=lambda: 0.999999)
    assert [longest.next() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert [round(shortest.next(), 4) for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_random_source_out_of_range_is_clamped() -> None:
    assert Backoff(initial=1.0, jitter=0.5, random=lambda: 7.0).next() == 0.5
    assert Backoff(initial=1.0, jitter=0.5, random=lambda: -1.0).next() == 1.0


def test_the_defaults_start_at_50_ms_and_stay_within_5_s() -> None:
    backoff = Backoff()
    pauses = [backoff.next() for _ in range(20)]
    assert 0.025 <= pauses[0] <= 0.05
    assert all(0 < p <= 5.0 for p in pauses)
    assert pauses[-1] >= 2.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0},
        {"initial": -1.0},
        {"initial": 2.0, "maximum": 1.0},
        {"jitter": 1.0},
        {"jitter": -0.1},
    ],
)
def test_settings_that_cannot_work_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)
