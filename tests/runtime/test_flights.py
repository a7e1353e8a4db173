"""The in-flight bookkeeping: what a dispatcher holds, and what its claims are
told of it (pure)."""

from __future__ import annotations

from dispatchers.runtime.flights import Flights
from tests.jobs import job


def test_the_bound_per_destination_is_counted_as_requests_start_and_end() -> None:
    flights = Flights(per_destination=2)
    a1, a2, b1 = job(id=1, destination="a"), job(id=2, destination="a"), job(id=3, destination="b")
    for each in (a1, a2, b1):
        flights.hold(each)
        flights.sending_started(each)

    assert (flights.sending, flights.at_bound) == (3, 1)
    assert dict(flights.sending_to) == {"a": 2, "b": 1}
    assert flights.sending_ended("a") is True  # it was at its bound: room again
    assert flights.sending_ended("b") is False
    assert dict(flights.sending_to) == {"a": 1}  # no zero counts go with a claim
    assert (flights.sending, flights.at_bound, len(flights)) == (1, 0, 3)


def test_a_claim_alone_with_one_destination_names_it_and_one_with_more_does_not() -> None:
    flights = Flights(per_destination=1)
    flights.claimed([job(id=1, destination="a"), job(id=2, destination="a")])
    assert (flights.alone, flights.crowded) == ("a", False)

    flights.claimed([])  # a claim that took nothing leaves what was learned
    assert flights.alone == "a"

    busy = job(id=3, destination="b")
    flights.hold(busy)
    flights.sending_started(busy)  # b is at its bound (1): it counts as met
    flights.claimed([job(id=4, destination="a")])
    assert (flights.alone, flights.crowded) == (None, True)


def test_an_outcome_settles_only_the_claim_it_belongs_to() -> None:
    flights = Flights(per_destination=5)
    first = flights.hold(job(id=1, attempts=1))
    stale = flights.drop(1)  # claimed again: the first attempt is lost
    assert stale is first and stale.job.attempts == 1
    assert flights.get(1) is None
    assert flights.hold(job(id=1, attempts=2)).job.attempts == 2

    assert flights.settle(1, attempt=1) is None  # the old attempt's outcome settles nothing
    assert flights.leases() == [(1, 2)]
    settled = flights.settle(1, attempt=2)
    assert settled is not None and settled.attempts == 2
    assert flights.leases() == [] and len(flights) == 0
    assert flights.drop(1) is None
