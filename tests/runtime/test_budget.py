"""The request slots of a process serving several databases: each database's share,
what a busy one may borrow, and what it must leave to the others."""

from __future__ import annotations

import pytest

from dispatchers.runtime.budget import Budget
from outbox.errors import ConfigurationError


def test_one_database_has_every_slot() -> None:
    (share,) = Budget(64).shares
    assert (share.size, share.free()) == (64, 64)
    share.take(60)
    assert share.free() == 4
    share.give_back(60)
    assert share.free() == 64


def test_the_shares_split_the_slots_with_the_remainder_to_the_first() -> None:
    budget = Budget(10, 3)
    assert [s.size for s in budget.shares] == [4, 3, 3]
    assert [s.reserve for s in budget.shares] == [1, 1, 1]


def test_fewer_slots_than_databases_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="concurrency: 2 is fewer than the 3 databases"):
        Budget(2, 3)


def test_a_busy_database_borrows_idle_slots_but_not_the_others_reserves() -> None:
    busy, idle = Budget(64, 2).shares
    assert idle.reserve == 8
    assert busy.free() == 56  # all but the idle one's reserve
    busy.take(56)
    assert busy.free() == 0
    assert idle.free() == 8  # its reserve is there at once
    idle.take(3)
    assert idle.free() == 5


def test_a_borrower_takes_no_slot_back_while_a_database_below_its_size_wants_one() -> None:
    budget = Budget(64, 2)
    busy, small = budget.shares
    busy.take(56)
    small.take(8)
    woken: list[str] = []
    small.notify = lambda: woken.append("small")
    busy.notify = lambda: woken.append("busy")
    small.wanting = True  # more messages than its slots
    busy.give_back(10)  # ten of the borrower's requests ended
    assert woken == ["small"]
    assert busy.free() == 0  # past its size of 32: the freed slots are not its
    assert small.free() == 10
    small.take(10)
    small.wanting = False
    busy.give_back(14)  # the borrower is at its size: it gets what comes back again
    assert busy.in_use == 32
    assert busy.free() == 14


def test_both_busy_end_at_their_sizes() -> None:
    busy, other = Budget(64, 2).shares
    busy.take(56)
    other.take(8)
    other.wanting = busy.wanting = True
    for _ in range(100):  # requests end one at a time; each loop claims what it may
        if busy.in_use > 0:
            busy.give_back(1)
        for share in (busy, other):
            share.take(share.free())
    assert (busy.in_use, other.in_use) == (32, 32)


def test_a_waiting_database_at_its_size_does_not_hold_the_others_back() -> None:
    a, b = Budget(64, 2).shares
    a.take(32)
    a.wanting = True  # at its size: it is not short of its share
    assert b.free() == 32


def test_two_claims_at_once_are_never_given_the_same_slot() -> None:
    a, b = Budget(16, 2).shares
    first = a.free()
    a.take(first)  # a's claim runs; b computes meanwhile
    second = b.free()
    b.take(second)
    assert first + second <= 16
