"""Which requests the bench receiver fails, delays or answers with a big body:
exact shares, picked by the request's number (pure)."""

from __future__ import annotations

from collections.abc import Callable

from dispatchers.bench.receiver import Replies


def picked(choose: Callable[[int], bool], count: int = 1000) -> set[int]:
    """The numbers of the requests, of the first ``count``, that ``choose`` picks."""
    return {n for n in range(1, count + 1) if choose(n)}


def test_the_receiver_fails_and_delays_exact_shares_that_never_meet() -> None:
    replies = Replies(delay=0.2, delay_share=0.05, fail_share=0.05)
    failed = picked(replies.failed)
    delayed = picked(replies.delayed)
    assert len(failed) == len(delayed) == 50
    assert failed.isdisjoint(delayed)
    assert min(failed) == 20
    assert min(delayed) == 10


def test_the_receiver_delays_every_request_by_default_and_fails_none() -> None:
    replies = Replies(delay=0.5)
    assert picked(replies.delayed) == set(range(1, 1001))
    assert picked(replies.failed) == set()
    assert picked(Replies().delayed) == set()  # no delay: nothing is held


def test_big_bodies_keep_their_share() -> None:
    assert len(picked(Replies(big_share=0.01).big)) == 10
