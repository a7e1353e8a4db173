"""Retry timing: backoff, schedules and Retry-After parsing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchers.delivery.retry import (
    MAX_DELAY,
    STANDARD_WEBHOOKS_SCHEDULE,
    ExponentialBackoff,
    RetryPolicy,
    Schedule,
    bounded_delay,
    parse_retry_after,
)
from outbox.errors import ConfigurationError

NOW = datetime(2015, 10, 21, 7, 26, 0, tzinfo=UTC)
LOWEST: Callable[[], float] = lambda: 0.0  # noqa: E731
HIGHEST: Callable[[], float] = lambda: 0.999999  # noqa: E731
MIDDLE: Callable[[], float] = lambda: 0.5  # noqa: E731 - jitter factor exactly 1.0

# Un-jittered delays of ExponentialBackoff() by attempt, worked out by hand:
# 2 * 2**(n-1), capped at 3600 from attempt 12 (2 * 2**11 = 4096).
NOMINAL = {
    1: 2.0,
    2: 4.0,
    3: 8.0,
    4: 16.0,
    5: 32.0,
    6: 64.0,
    7: 128.0,
    8: 256.0,
    9: 512.0,
    10: 1024.0,
    11: 2048.0,
}


def nominal(attempt: int) -> float:
    return NOMINAL.get(attempt, 3600.0)


# --- ExponentialBackoff ---------------------------------------------------------------


def test_backoff_satisfies_retry_policy_protocol() -> None:
    policy: RetryPolicy = ExponentialBackoff(random=MIDDLE)
    assert policy.delay(1) == 2.0


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (10, 1024.0), (11, 2048.0), (12, 3600.0)],
)
def test_backoff_doubles_from_base_until_cap(attempt: int, expected: float) -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(attempt) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 1.6), (2, 3.2), (3, 6.4), (11, 1638.4), (12, 2880.0), (40, 2880.0)],
)
def test_backoff_lowest_jitter_is_eighty_percent(attempt: int, expected: float) -> None:
    assert ExponentialBackoff(random=LOWEST).delay(attempt) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    # 1 + 0.2 * (2 * 0.999999 - 1) = 1.1999996
    [(1, 2.3999992), (2, 4.7999984), (11, 2457.5991808)],
)
def test_backoff_highest_jitter_is_just_under_120_percent(attempt: int, expected: float) -> None:
    assert ExponentialBackoff(random=HIGHEST).delay(attempt) == pytest.approx(expected)


@pytest.mark.parametrize("attempt", [12, 13, 50])
def test_backoff_jitter_never_exceeds_cap(attempt: int) -> None:
    # 3600 * 1.1999996 would be 4319.99856
    assert ExponentialBackoff(random=HIGHEST).delay(attempt) == 3600.0


def test_backoff_huge_attempt_count_does_not_overflow() -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(100_000) == 3600.0


def test_backoff_custom_parameters_without_jitter() -> None:
    policy = ExponentialBackoff(base=1.0, factor=3.0, cap=100.0, jitter=0.0, random=HIGHEST)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]


def test_backoff_factor_one_is_constant() -> None:
    policy = ExponentialBackoff(base=30.0, factor=1.0, cap=30.0, jitter=0.0)
    assert [policy.delay(n) for n in (1, 2, 50)] == [30.0, 30.0, 30.0]


def test_backoff_default_random_stays_within_jitter_bounds() -> None:
    for _ in range(50):
        assert 1.6 <= ExponentialBackoff().delay(1) <= 2.4


@settings(database=None, max_examples=300)
@given(
    attempt=st.integers(min_value=1, max_value=80),
    r=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_backoff_jitter_bounds_hold_for_any_random_value(attempt: int, r: float) -> None:
    delay = ExponentialBackoff(random=lambda: r).delay(attempt)
    low = 0.8 * nominal(attempt)
    high = min(3600.0, 1.2 * nominal(attempt))
    assert low * (1 - 1e-12) <= delay <= high * (1 + 1e-12)
    assert delay <= 3600.0


@settings(database=None, max_examples=200)
@given(
    attempt=st.integers(min_value=1, max_value=80),
    r=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_backoff_never_shrinks_as_attempts_grow(attempt: int, r: float) -> None:
    policy = ExponentialBackoff(random=lambda: r)
    assert policy.delay(attempt + 1) >= policy.delay(attempt)


def test_backoff_retry_after_lengthens_delay() -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(1, retry_after=120.0) == 120.0


def test_backoff_retry_after_never_shortens_delay() -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(3, retry_after=1.0) == 8.0


def test_backoff_retry_after_bounded_by_default_six_hours() -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(1, retry_after=100_000.0) == 21600.0


def test_backoff_retry_after_bounded_by_custom_max() -> None:
    policy = ExponentialBackoff(random=MIDDLE, max_retry_after=60.0)
    assert policy.delay(1, retry_after=120.0) == 60.0


def test_backoff_retry_after_may_exceed_cap_up_to_max_retry_after() -> None:
    policy = ExponentialBackoff(cap=10.0, random=MIDDLE)
    assert policy.delay(20, retry_after=7200.0) == 7200.0


def test_backoff_retry_after_bound_does_not_shorten_computed_delay() -> None:
    policy = ExponentialBackoff(random=MIDDLE, max_retry_after=0.0)
    assert policy.delay(3, retry_after=500.0) == 8.0


@pytest.mark.parametrize("retry_after", [-5.0, math.nan])
def test_backoff_negative_or_nan_retry_after_is_ignored(retry_after: float) -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(2, retry_after=retry_after) == 4.0


def test_backoff_infinite_retry_after_is_bounded() -> None:
    assert ExponentialBackoff(random=MIDDLE).delay(1, retry_after=math.inf) == 21600.0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"base": 0.0}, "base"),
        ({"base": -1.0}, "base"),
        ({"base": math.nan}, "base"),
        ({"factor": 0.5}, "factor"),
        ({"factor": math.inf}, "factor"),
        ({"base": 10.0, "cap": 5.0}, "cap"),
        ({"cap": math.inf}, "cap"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": math.nan}, "jitter"),
        ({"max_retry_after": -1.0}, "max_retry_after"),
        ({"max_retry_after": math.inf}, "max_retry_after"),
        ({"base": 1e300, "cap": 1e308}, "cap"),
        ({"cap": MAX_DELAY * 2}, "cap"),
        ({"max_retry_after": MAX_DELAY * 2}, "max_retry_after"),
    ],
)
def test_backoff_rejects_invalid_settings_naming_the_field(
    changes: dict[str, float], field: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"^{field} must be"):
        ExponentialBackoff(**changes)  # type: ignore[arg-type]


def test_backoff_is_immutable() -> None:
    policy = ExponentialBackoff()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.cap = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("attempt", [0, -1])
def test_backoff_rejects_attempt_below_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt"):
        ExponentialBackoff().delay(attempt)


# --- Schedule -------------------------------------------------------------------------


def test_standard_webhooks_schedule_spans_about_a_day() -> None:
    assert STANDARD_WEBHOOKS_SCHEDULE.delays == (5, 300, 1800, 7200, 18000, 36000, 36000)
    assert sum(STANDARD_WEBHOOKS_SCHEDULE.delays) == 99305  # 27 h 35 min 5 s
    assert STANDARD_WEBHOOKS_SCHEDULE.jitter == 0.1


def test_standard_webhooks_schedule_repeats_last_delay() -> None:
    schedule = dataclasses.replace(STANDARD_WEBHOOKS_SCHEDULE, random=MIDDLE)
    assert [schedule.delay(n) for n in range(1, 10)] == [
        5.0,
        300.0,
        1800.0,
        7200.0,
        18000.0,
        36000.0,
        36000.0,
        36000.0,
        36000.0,
    ]


def test_schedule_lowest_jitter_is_ninety_percent() -> None:
    schedule = Schedule(delays=(10.0, 300.0), random=LOWEST)
    assert schedule.delay(1) == pytest.approx(9.0)
    assert schedule.delay(2) == pytest.approx(270.0)


def test_schedule_highest_jitter_is_just_under_110_percent() -> None:
    # 1 + 0.1 * (2 * 0.999999 - 1) = 1.0999998
    schedule = Schedule(delays=(10.0, 300.0), random=HIGHEST)
    assert schedule.delay(1) == pytest.approx(10.999998)
    assert schedule.delay(2) == pytest.approx(329.99994)


@settings(database=None, max_examples=200)
@given(
    attempt=st.integers(min_value=1, max_value=30),
    r=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_schedule_jitter_bounds_hold_for_any_random_value(attempt: int, r: float) -> None:
    schedule = Schedule(delays=(5.0, 300.0, 1800.0), random=lambda: r)
    base = {1: 5.0, 2: 300.0}.get(attempt, 1800.0)
    delay = schedule.delay(attempt)
    assert 0.9 * base * (1 - 1e-12) <= delay <= 1.1 * base * (1 + 1e-12)


def test_schedule_honours_retry_after_within_bounds() -> None:
    schedule = Schedule(delays=(5.0,), random=MIDDLE)
    assert schedule.delay(1, retry_after=60.0) == 60.0
    assert schedule.delay(1, retry_after=2.0) == 5.0
    assert schedule.delay(1, retry_after=1e9) == 21600.0


def test_schedule_zero_delay_is_allowed() -> None:
    assert Schedule(delays=(0.0, 1.0), random=HIGHEST).delay(1) == 0.0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"delays": ()}, "delays"),
        ({"delays": (5.0, -1.0)}, "delays"),
        ({"delays": (math.inf,)}, "delays"),
        ({"delays": (5.0, 1e308)}, "delays"),
        ({"jitter": 1.0}, "jitter"),
        ({"max_retry_after": -1.0}, "max_retry_after"),
    ],
)
def test_schedule_rejects_invalid_settings_naming_the_field(
    changes: dict[str, object], field: str
) -> None:
    kwargs: dict[str, object] = {"delays": (5.0,), **changes}
    with pytest.raises(ConfigurationError, match=f"^{field} must be"):
        Schedule(**kwargs)  # type: ignore[arg-type]


# --- parse_retry_after ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("007", 7.0),
        ("315360000", 315360000.0),  # exactly 10 years (of 365 days) is still accepted
    ],
)
def test_parse_retry_after_delta_seconds(value: str, expected: float) -> None:
    assert parse_retry_after(value, now=NOW) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Wed, 21 Oct 2015 07:28:00 GMT", 120.0),
        ("Wed, 21 Oct 2015 09:28:00 +0200", 120.0),
        ("Wed, 21 Oct 2015 07:28:00 -0000", 120.0),
        ("Wednesday, 21-Oct-15 07:28:00 GMT", 120.0),
        ("Thu, 22 Oct 2015 07:26:00 GMT", 86400.0),
        # 2015-10-21 to 2023-10-21: 8 * 365 + 2 leap days = 2922 days
        ("Sat, 21 Oct 2023 07:28:00 GMT", 2922 * 86400.0 + 120.0),
    ],
)
def test_parse_retry_after_http_date(value: str, expected: float) -> None:
    assert parse_retry_after(value, now=NOW) == expected


def test_parse_retry_after_http_date_with_non_utc_now() -> None:
    now = datetime(2015, 10, 21, 9, 26, 0, tzinfo=timezone(timedelta(hours=2)))
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 120.0


@pytest.mark.parametrize(
    "value", ["Wed, 21 Oct 2015 07:20:00 GMT", "Thu, 01 Jan 1970 00:00:00 GMT"]
)
def test_parse_retry_after_past_date_is_zero(value: str) -> None:
    assert parse_retry_after(value, now=NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "soon",
        "-5",
        "+120",
        "1.5",
        "1e3",
        "0x10",
        "12 0",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: not an HTTP digit
        "Wed, 32 Oct 2015 07:28:00 GMT",
        "21 Oct 2015",
    ],
)
def test_parse_retry_after_ignores_missing_or_garbage(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize(
    "value",
    ["315360001", "9" * 30, "9" * 5000, "Sat, 21 Oct 2045 07:28:00 GMT"],
)
def test_parse_retry_after_ignores_absurdly_distant_values(value: str) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_parse_retry_after_requires_aware_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_retry_after("120", now=datetime(2015, 10, 21, 7, 26))


# --- boundaries and texts that mutation testing found unpinned -------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ExponentialBackoff(base=-1.0), "base must be > 0, got -1.0"),
        (lambda: ExponentialBackoff(factor=0.5), "factor must be >= 1, got 0.5"),
        (
            lambda: ExponentialBackoff(base=10.0, cap=5.0),
            f"cap must be from base to {MAX_DELAY:g}, got 5.0",
        ),
        (lambda: ExponentialBackoff(jitter=1.0), "jitter must be in [0, 1), got 1.0"),
        (
            lambda: ExponentialBackoff(max_retry_after=-1.0),
            f"max_retry_after must be from 0 to {MAX_DELAY:g}, got -1.0",
        ),
        (lambda: Schedule(delays=()), "delays must be non-empty, got ()"),
        (
            lambda: Schedule(delays=(5.0, -1.0)),
            f"delays must be from 0 to {MAX_DELAY:g}, got (5.0, -1.0)",
        ),
        (lambda: Schedule(delays=(5.0,), jitter=1.0), "jitter must be in [0, 1), got 1.0"),
    ],
)
def test_an_invalid_setting_is_refused_saying_the_rule_and_the_value(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        make()
    assert str(refused.value) == message


def test_the_longest_delay_is_allowed_everywhere_a_delay_is_set() -> None:
    backoff = ExponentialBackoff(cap=MAX_DELAY, max_retry_after=MAX_DELAY, jitter=0.0)
    assert backoff.delay(100) == MAX_DELAY
    schedule = Schedule(delays=(MAX_DELAY,), jitter=0.0, max_retry_after=MAX_DELAY)
    assert schedule.delay(1, retry_after=math.inf) == MAX_DELAY


def test_a_schedule_without_jitter_waits_its_delays_exactly() -> None:
    assert Schedule(delays=(5.0, 300.0), jitter=0.0).delay(2) == 300.0


def _no_random() -> float:
    raise AssertionError("a policy without jitter draws no random number")


def test_a_policy_without_jitter_draws_no_random_number() -> None:
    assert ExponentialBackoff(jitter=0.0, random=_no_random).delay(3) == 8.0
    assert Schedule(delays=(5.0,), jitter=0.0, random=_no_random).delay(1) == 5.0


@pytest.mark.parametrize(("r", "expected"), [(5.0, 12.0), (-3.0, 8.0)])
def test_a_random_source_out_of_range_is_held_to_the_jitter_bounds(
    r: float, expected: float
) -> None:
    delay = ExponentialBackoff(base=10.0, jitter=0.2, random=lambda: r).delay(1)
    assert delay == pytest.approx(expected)


@pytest.mark.parametrize("retry_after", [0.0, -5.0])
def test_a_retry_after_of_zero_or_less_leaves_a_short_delay_alone(retry_after: float) -> None:
    schedule = Schedule(delays=(0.5,), jitter=0.0)
    assert schedule.delay(1, retry_after=retry_after) == 0.5


@pytest.mark.parametrize(
    ("delay", "held"),
    [(0.5, 0.5), (0.0, 0.0), (-1.0, 0.0), (-math.inf, 0.0), (math.nan, 0.0), (math.inf, MAX_DELAY)],
)
def test_bounded_delay_holds_a_delay_from_zero_to_the_longest(delay: float, held: float) -> None:
    assert bounded_delay(delay) == held


class _NoOffset(tzinfo):
    """A time zone that knows no offset: as naive as no time zone at all."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


def test_parse_retry_after_refuses_a_now_whose_time_zone_has_no_offset() -> None:
    with pytest.raises(ValueError) as refused:
        parse_retry_after("120", now=datetime(2015, 10, 21, 7, 26, tzinfo=_NoOffset()))
    assert str(refused.value) == "now must be timezone-aware"


def test_parse_retry_after_reads_up_to_20_digits_and_refuses_longer_unread() -> None:
    """Reading a number is bounded: 20 digits are read (leading zeros included),
    a longer run of digits is refused as absurd without converting it."""
    assert parse_retry_after("0" * 17 + "120", now=NOW) == 120.0
    assert parse_retry_after("0" * 18 + "120", now=NOW) is None
