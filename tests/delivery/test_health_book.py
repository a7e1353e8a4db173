"""Destination health decided in memory: what counts as a failure, when a
breaker opens (a failure ratio over a sliding window), and when a hold is
written, with an injected clock."""

from __future__ import annotations

import pytest

from dispatchers.delivery.health import HOLD_SLACK, HealthBook, hold_for, is_counted, is_failure
from dispatchers.delivery.outcome import Outcome, Verdict, classify_response
from dispatchers.runtime.config import BreakerSettings

SETTINGS = BreakerSettings(
    window=10.0, min_attempts=4, failure_ratio=0.5, backoff=1.0, backoff_max=8.0
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _status(status: int, retry_after: str | None = None) -> Outcome:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return classify_response(status, headers)


def _error(error_class: str) -> Outcome:
    return Outcome(Verdict.RETRY, None, error_class, error_class, None)


OK = _status(200)
DOWN = _status(503)


@pytest.mark.parametrize(
    ("outcome", "failed"),
    [
        (_status(200), False),
        (_status(500), True),
        (_status(503), True),
        (_status(408), True),
        (_status(429), True),
        (_status(400), False),
        (_status(404), False),
        (_status(410), False),
        (_status(422), False),
        (_status(425), False),
        (_status(302), False),
        (_error("timeout"), True),
        (_error("connect_error"), True),
        (_error("protocol_error"), True),
        (_error("network_error"), True),
        (_error("internal_error"), False),
        (Outcome(Verdict.FAILED, None, "blocked", "blocked_destination", None), False),
    ],
)
def test_5xx_408_429_and_transport_errors_are_failures_other_answers_are_not(
    outcome: Outcome, failed: bool
) -> None:
    assert is_failure(outcome) is failed


REFUSED = Outcome(Verdict.FAILED, None, "blocked", "blocked_destination", None)


@pytest.mark.parametrize(
    ("outcome", "counted"),
    [
        (REFUSED, False),
        (_error("invalid_url"), False),
        (_error("unsupported_protocol"), False),
        (_error("internal_error"), False),
        (_error("timeout"), True),
        (_error("connect_error"), True),
        (_status(200), True),
        (_status(404), True),
        (_status(503), True),
    ],
)
def test_only_attempts_that_reached_the_destination_count(outcome: Outcome, counted: bool) -> None:
    assert is_counted(outcome) is counted


def test_refusals_of_the_ssrf_guard_do_not_dilute_the_failures_that_open_a_breaker() -> None:
    book = HealthBook(SETTINGS, clock=Clock())
    # ten refusals: counted as successes they would keep 4 failures of 14 below one half
    assert [book.note("d", REFUSED) for _ in range(10)] == [False] * 10
    assert [book.note("d", DOWN) for _ in range(3)] == [False] * 3
    assert book.note("d", DOWN) is True  # 4 of 4 sent requests failed
    assert len(book) == 0  # and the refusals alone never put it in the book
    assert [book.note("e", REFUSED) for _ in range(20)] == [False] * 20
    assert len(book) == 0


def test_a_hold_is_the_retry_after_of_a_429_or_503_within_the_cap() -> None:
    assert hold_for(_status(429, "2"), 3600) == 2.0
    assert hold_for(_status(503, "120"), 60) == 60.0
    assert hold_for(_status(500, "2"), 3600) is None  # only 429 and 503 hold
    assert hold_for(_status(429), 3600) is None  # no Retry-After
    assert hold_for(_status(429, "0"), 3600) is None


def test_the_breaker_opens_once_enough_attempts_in_the_window_mostly_failed() -> None:
    book = HealthBook(SETTINGS, clock=Clock())
    # three failures: too few attempts to judge
    assert [book.note("d", DOWN) for _ in range(3)] == [False, False, False]
    assert book.note("d", DOWN) is True  # the fourth: 4 of 4 failed
    # opening starts the window afresh
    assert [book.note("d", DOWN) for _ in range(3)] == [False, False, False]


def test_successes_in_the_window_keep_the_ratio_below_the_threshold() -> None:
    book = HealthBook(SETTINGS, clock=Clock())
    for _ in range(6):
        assert book.note("d", OK) is False
    # 5 failures of 11 attempts: below one half
    assert [book.note("d", DOWN) for _ in range(5)] == [False] * 5
    assert book.note("d", DOWN) is True  # 6 of 12: one half
    assert book.note("other", DOWN) is False  # each destination on its own


def test_outcomes_older_than_the_window_no_longer_count() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    for _ in range(3):
        book.note("d", DOWN)
    clock.now += SETTINGS.window + 0.1
    # the three old failures slid out: one new failure is one attempt
    assert book.note("d", DOWN) is False
    for _ in range(8):
        book.note("d", OK)
    clock.now += SETTINGS.window / 2
    # 1 failure of 9 in the window, then 3 more: 4 of 12
    assert [book.note("d", DOWN) for _ in range(3)] == [False] * 3


def test_successes_never_open_and_quiet_destinations_leave_the_book() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    for _ in range(20):
        assert book.note("a", OK) is False
    book.note("b", DOWN)
    assert len(book) == 2
    clock.now += 2 * SETTINGS.window
    book.note("c", OK)
    assert len(book) == 1


def test_forgetting_a_destination_drops_its_failures() -> None:
    book = HealthBook(SETTINGS, clock=Clock())
    for _ in range(3):
        book.note("d", DOWN)
    book.forget("d")
    assert [book.note("d", DOWN) for _ in range(3)] == [False] * 3


def test_a_hold_is_written_again_only_when_it_lasts_longer() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    assert book.hold("d", 2.0) is True
    clock.now += 0.5
    assert book.hold("d", 2.0) is False  # the same hold, seen again
    assert book.hold("other", 2.0) is True
    assert book.hold("d", 2.0 + HOLD_SLACK) is True  # outlasts it
    clock.now += 10
    assert book.hold("d", 1.0) is True  # the earlier one has ended


# --- boundaries that mutation testing found unpinned ------------------------------------


def test_a_hold_of_less_than_a_second_is_a_hold() -> None:
    # an HTTP-date Retry-After is counted from now, to a fraction of a second
    held = Outcome(Verdict.RETRY, 503, "HTTP 503", "http_503", 0.5)
    assert hold_for(held, 3600) == 0.5


def test_an_outcome_exactly_a_window_old_no_longer_counts() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    clock.now = 1009.0
    assert [book.note("d", DOWN) for _ in range(3)] == [False] * 3
    clock.now = 1010.0
    book.note("other", OK)  # the book's sweep, due now: none is due at 1019
    clock.now = 1019.0  # "d"'s failures are exactly a window old
    assert book.note("d", DOWN) is False  # one attempt in the window, not four


def test_outcomes_within_a_tenth_of_the_window_slide_out_together() -> None:
    """The window is kept as ten buckets: an outcome leaves it with the bucket it
    was counted in, a window after that bucket began."""
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    book.note("d", DOWN)
    clock.now += SETTINGS.window / 20  # within the first bucket
    assert [book.note("d", DOWN) for _ in range(2)] == [False, False]
    clock.now = 1000.0 + SETTINGS.window + 0.2  # the first bucket has ended
    assert [book.note("d", DOWN) for _ in range(2)] == [False, False]  # 2 attempts


def test_a_new_bucket_begins_a_tenth_of_the_window_after_the_last() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    assert [book.note("d", OK) for _ in range(3)] == [False] * 3
    clock.now += SETTINGS.window / 10  # exactly: a bucket of its own
    assert [book.note("d", DOWN) for _ in range(2)] == [False, False]  # 2 of 5
    clock.now = 1000.0 + SETTINGS.window + 0.5  # the first bucket has ended, not the second
    assert [book.note("d", DOWN) for _ in range(2)] == [False, True]  # 4 of 4


def test_a_destination_with_outcomes_in_its_window_stays_in_the_book_at_a_sweep() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    clock.now += SETTINGS.window - 1  # recent when the sweep comes
    assert [book.note("d", DOWN) for _ in range(3)] == [False] * 3
    clock.now += 1.5  # past the first sweep
    book.note("other", OK)
    assert len(book) == 2
    assert book.note("d", DOWN) is True  # its three failures were kept


def test_quiet_destinations_leave_the_book_at_the_sweep_once_a_window() -> None:
    """A sweep of the book is a pass over every destination: it runs at the
    first note a window after the last one (the first a window after the book
    was made), and removes those with no outcome in the window."""
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    clock.now = 1002.0
    book.note("a", OK)
    clock.now = 1010.0  # the first sweep: "a" is recent
    book.note("b", OK)
    clock.now = 1012.5  # "a" is quiet, but no sweep is due until 1020
    book.note("c", OK)
    assert len(book) == 3
    clock.now = 1020.0  # "a" and "b" (exactly a window old) are quiet
    book.note("d", OK)
    assert len(book) == 2


def test_a_longer_hold_of_the_same_destination_is_written_at_once() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    assert book.hold("d", 2.0) is True
    clock.now += 0.5
    assert book.hold("d", 5.0) is True


def test_a_hold_outlasting_the_last_by_exactly_the_slack_is_written() -> None:
    book = HealthBook(SETTINGS, clock=Clock())
    assert book.hold("d", 2.0) is True
    assert book.hold("d", 2.0 + HOLD_SLACK) is True


def test_the_first_hold_of_a_destination_is_written_early_in_the_clock() -> None:
    clock = Clock()
    clock.now = 0.7  # a monotonic clock starts anywhere
    assert HealthBook(SETTINGS, clock=clock).hold("d", 0.5) is True


def test_the_first_hold_of_a_destination_is_written_at_the_clocks_origin() -> None:
    # no earlier hold is not one that ended at clock 0
    clock = Clock()
    clock.now = 0.0
    assert HealthBook(SETTINGS, clock=clock).hold("d", 0.5) is True


def test_forgetting_a_destination_never_seen_is_nothing() -> None:
    book = HealthBook(SETTINGS, clock=Clock())
    book.forget("never-seen")
    assert len(book) == 0


def test_a_hold_that_has_ended_is_dropped_when_another_is_written() -> None:
    clock = Clock()
    book = HealthBook(SETTINGS, clock=clock)
    assert book.hold("d", 2.0) is True
    clock.now += 2.0  # "d"'s hold ends now
    assert book.hold("other", 1.0) is True  # and is dropped from the book
    assert book.hold("d", 0.5) is True  # a new hold of "d", however short
