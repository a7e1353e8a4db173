"""The claim cadence: when a dispatcher claims, and when it wants notifications."""

from __future__ import annotations

import itertools

import pytest

from dispatchers.runtime.cadence import EMPTY_STREAK_IDLE, Cadence

WINDOW, POLL = 0.005, 1.0


def cadence() -> Cadence:
    return Cadence(window=WINDOW, poll_interval=POLL)


def steady(c: Cadence, *, rate: float, seconds: float, start: float = 0.0) -> float:
    """Claims once per window for ``seconds``, each taking what ``rate`` brought."""
    now = start
    while now < start + seconds:
        c.claimed(round(rate * WINDOW), 64, now)
        now += WINDOW
    return now


def test_a_new_dispatcher_is_idle_and_claims_at_once_on_a_notification() -> None:
    c = cadence()
    assert not c.busy
    c.claimed(1, 64, 10.0)
    assert not c.busy  # one message is not a stream
    assert c.earliest_claim() == pytest.approx(10.0 + WINDOW)
    assert c.next_claim(on_duty=True, notified=True) == pytest.approx(10.0 + POLL)


def test_a_steady_stream_above_one_message_per_window_makes_it_busy() -> None:
    c = cadence()
    steady(c, rate=500, seconds=0.2)
    assert not c.busy  # the estimate takes a few horizons to settle
    steady(c, rate=500, seconds=2.0, start=0.2)
    assert c.busy
    assert c.rate == pytest.approx(round(500 * WINDOW) / WINDOW, rel=0.05)


def test_a_stream_below_one_message_per_window_keeps_it_idle() -> None:
    c = cadence()
    now = 0.0
    for _ in range(200):  # 100 per second: one message every 10 ms
        c.claimed(1, 64, now)
        now += 0.01
    assert not c.busy


def test_busy_turns_idle_after_empty_claims_in_a_row() -> None:
    c = cadence()
    now = steady(c, rate=500, seconds=2.0)
    for i in range(EMPTY_STREAK_IDLE):
        assert c.busy, i
        c.claimed(0, 64, now)
        now += WINDOW
    assert not c.busy


def test_busy_stays_busy_through_one_empty_window() -> None:
    c = cadence()
    now = steady(c, rate=500, seconds=2.0)
    c.claimed(0, 64, now)
    c.claimed(3, 64, now + WINDOW)
    assert c.busy


def test_busy_turns_idle_when_the_rate_falls_below_half_a_message_per_window() -> None:
    c = cadence()
    now = steady(c, rate=500, seconds=2.0)
    for _ in range(100):  # one message every 50 ms
        now += 0.05
        c.claimed(1, 64, now)
    assert not c.busy


def test_a_full_claim_means_a_backlog_claim_again_at_once() -> None:
    c = cadence()
    c.claimed(64, 64, 3.0)
    assert c.next_claim(on_duty=False, notified=False) == 3.0
    assert c.earliest_claim() == 3.0


def test_off_duty_and_notified_dispatchers_poll_every_poll_interval() -> None:
    c = cadence()
    c.claimed(2, 64, 7.0)
    assert c.next_claim(on_duty=False, notified=False) == pytest.approx(7.0 + POLL)
    assert c.next_claim(on_duty=True, notified=True) == pytest.approx(7.0 + POLL)


def test_on_duty_without_notifications_the_timer_stretches_per_empty_claim() -> None:
    c = cadence()
    now = steady(c, rate=500, seconds=2.0)
    assert c.next_claim(on_duty=True, notified=False) == pytest.approx(now - WINDOW + WINDOW)
    gaps = []
    for _ in range(12):
        c.claimed(0, 64, now)
        gaps.append(c.next_claim(on_duty=True, notified=False) - now)
        now += gaps[-1]
    assert gaps[:3] == pytest.approx([2 * WINDOW, 4 * WINDOW, 8 * WINDOW])
    assert gaps[-1] == pytest.approx(POLL)  # never longer than the poll interval
    assert all(a <= b for a, b in itertools.pairwise(gaps))


def test_without_a_window_it_stays_idle_and_claims_on_every_notification() -> None:
    c = Cadence(window=0.0, poll_interval=POLL)
    now = 0.0
    for _ in range(1000):  # 1,000 per second
        c.claimed(1, 64, now)
        now += 0.001
    assert not c.busy
    assert c.earliest_claim() == c.last_claim
    # waiting for the wake lock, it still polls on a timer, never in a busy loop
    assert c.next_claim(on_duty=True, notified=False) > c.last_claim


def test_a_claim_held_back_by_a_rate_limit_claims_again_when_its_slot_frees() -> None:
    c = cadence()
    c.claimed(2, 64, 7.0, rate_wait=0.1)
    assert c.next_claim(on_duty=False, notified=False) == pytest.approx(7.1)
    assert c.next_claim(on_duty=True, notified=True) == pytest.approx(7.1)
    c.claimed(0, 64, 8.0, rate_wait=5.0)  # never later than the poll
    assert c.next_claim(on_duty=False, notified=False) == pytest.approx(8.0 + POLL)
    c.claimed(0, 64, 9.0)  # the next claim met no limit: polls again
    assert c.next_claim(on_duty=False, notified=False) == pytest.approx(9.0 + POLL)


# --- boundaries that mutation testing found unpinned ------------------------------------


def test_exactly_one_message_per_window_is_not_yet_busy() -> None:
    c = Cadence(window=1.0, poll_interval=5.0, horizon=1.0)
    c.claimed(1, 64, 0.0)  # a rate of one per second, one per window
    assert c.busy is False


def test_a_busy_dispatcher_stays_busy_down_to_half_a_message_per_window() -> None:
    c = Cadence(window=1.0, poll_interval=5.0, horizon=1.0, busy=True, rate=0.5, last_claim=0.0)
    c.claimed(0, 64, 0.0)  # empty, and the rate is exactly one per two windows
    assert c.busy is True


def test_a_busy_dispatcher_between_half_and_one_message_per_window_stays_busy() -> None:
    c = Cadence(window=1.0, poll_interval=5.0, horizon=1.0, busy=True, rate=1.0, last_claim=0.0)
    c.claimed(0, 64, 0.0)
    assert c.busy is True


def test_without_a_window_a_dispatcher_is_never_busy() -> None:
    c = Cadence(window=0.0, poll_interval=5.0)
    for now in range(5):
        c.claimed(64, 64, float(now))
    assert c.busy is False


def test_empty_claims_stretch_the_timer_at_most_sixteen_doublings() -> None:
    c = Cadence(window=0.001, poll_interval=1000.0, busy=True)
    for _ in range(20):
        c.claimed(0, 64, 0.0)
    assert c.next_claim(on_duty=True, notified=False) == pytest.approx(0.001 * 2**16)
