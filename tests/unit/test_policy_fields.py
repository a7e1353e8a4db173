"""A rate limit, its burst and a destination's origin, checked before they are
written: each error names the field, and the default burst is a second's worth."""

from __future__ import annotations

import pytest

from outbox._policy_fields import (
    DEFAULT_MAX_BURST,
    MAX_BURST,
    RateChange,
    changed_rate,
    check_rate_change,
    default_burst,
    rate_fields,
)
from outbox.destinations import check_destination
from outbox.errors import InvalidMessage


@pytest.mark.parametrize(
    ("rate", "burst"), [(0.001, 1), (0.5, 1), (1, 1), (2.5, 3), (20, 10), (10_000, 10)]
)
def test_the_default_burst_is_about_a_seconds_worth_from_1_to_10(rate: float, burst: int) -> None:
    assert default_burst(rate) == burst <= DEFAULT_MAX_BURST
    assert rate_fields(rate, None) == {"rate_limit": float(rate), "burst": burst}


@pytest.mark.parametrize(
    ("field", "rate", "burst"),
    [
        ("rate_limit", 0, None),
        ("rate_limit", -1, None),
        ("rate_limit", float("nan"), None),
        ("rate_limit", float("inf"), None),
        ("rate_limit", 10_001, None),
        ("rate_limit", True, None),
        ("rate_limit", "20", None),
        ("burst", 20, 0),
        ("burst", 20, 101),
        ("burst", 20, 2.5),
        ("burst", None, 5),
    ],
)
def test_a_bad_rate_limit_or_burst_is_refused_naming_it(
    field: str, rate: object, burst: object
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        rate_fields(rate, burst)
    assert refused.value.field == field


def test_an_update_keeps_changes_or_removes_the_limit() -> None:
    current = RateChange(20.0, 10)
    assert changed_rate(current, check_rate_change(None, None, clear=False)) == {
        "rate_limit": 20.0,
        "burst": 10,
    }
    assert changed_rate(current, check_rate_change(None, 4, clear=False)) == {
        "rate_limit": 20.0,
        "burst": 4,
    }
    assert changed_rate(current, check_rate_change(2, None, clear=False)) == {
        "rate_limit": 2.0,
        "burst": 2,
    }
    assert changed_rate(current, check_rate_change(None, None, clear=True)) == {
        "rate_limit": None,
        "burst": None,
    }
    with pytest.raises(InvalidMessage) as refused:
        check_rate_change(5, None, clear=True)
    assert refused.value.field == "rate_limit"
    with pytest.raises(InvalidMessage) as refused:
        changed_rate(RateChange(None, None), check_rate_change(None, 3, clear=False))
    assert refused.value.field == "burst"


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("https://API.example.com", "https://api.example.com:443"),
        ("https://api.example.com/v1/orders?x=1", "https://api.example.com:443"),
        ("http://127.0.0.1:8080/hook", "http://127.0.0.1:8080"),
        ("http://[::1]/", "http://[::1]:80"),
    ],
)
def test_a_destination_is_the_origin_of_the_url_given(given: str, origin: str) -> None:
    assert check_destination(given) == origin


@pytest.mark.parametrize("given", ["api.example.com", "ftp://example.com", "", 5])
def test_a_destination_that_is_not_an_http_url_is_refused(given: object) -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_destination(given)
    assert refused.value.field == "destination"


@pytest.mark.parametrize(
    ("rate", "burst", "message"),
    [
        ("20", None, "rate_limit: must be a number, not str"),
        (0, None, "rate_limit: must be from 0.001 to 10000 requests per second"),
        (20, 0, "burst: must be an integer from 1 to 100"),
        (None, 5, "burst: needs a rate limit"),
    ],
)
def test_a_bad_rate_limit_or_burst_is_refused_saying_why(
    rate: object, burst: object, message: str
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        rate_fields(rate, burst)
    assert str(refused.value) == message


@pytest.mark.parametrize("burst", [1, MAX_BURST])
def test_a_burst_from_1_to_the_largest_is_taken(burst: int) -> None:
    assert rate_fields(20, burst) == {"rate_limit": 20.0, "burst": burst}


@pytest.mark.parametrize("burst", ["3", 2.5, True])
def test_an_update_refuses_a_burst_that_is_not_an_integer(burst: object) -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_rate_change(None, burst, clear=False)
    assert str(refused.value) == f"burst: must be an integer from 1 to {MAX_BURST}"


def test_an_update_refuses_a_limit_both_given_and_removed_saying_so() -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_rate_change(5, None, clear=True)
    assert str(refused.value) == "rate_limit: give a rate limit or remove it, not both"
