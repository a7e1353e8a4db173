"""Retry schedules stored per endpoint and per event type: the command line's
spans, the library's check, and the policy a claimed message follows."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest

from dispatchers.cli._common import retry_schedule
from dispatchers.delivery.outcome import Outcome, Verdict, decide
from dispatchers.delivery.retry import (
    DEFAULT_MAX_RETRY_AFTER,
    ExponentialBackoff,
    Schedule,
    policy_for,
)
from dispatchers.ui.policy_text import format_schedule
from outbox import EventTypes, InvalidArgument
from outbox._retry_schedule import check_retry_schedule
from outbox.defaults import MAX_RETRY_DELAY, MAX_RETRY_SCHEDULE
from tests.errors import invalid_argument

MIGRATION = Path(__file__).resolve().parents[2] / "sql/migrations/0017_retry_schedules.sql"
NO_TX = object()  # never reached: the arguments are refused first
RETRY_503 = Outcome(Verdict.RETRY, 503, "HTTP 503", "http_503", None)


def test_a_schedule_is_read_as_comma_separated_spans() -> None:
    assert retry_schedule("5s,1m,10m,1h") == (5.0, 60.0, 600.0, 3600.0)
    assert retry_schedule("5m,5m,7d") == (300.0, 300.0, 604800.0)  # a delay may repeat


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "is not a positive span"),
        ("5s,", "is not a positive span"),
        ("-5s", "is not a positive span"),
        ("0s", "is not a positive span"),
        ("soon", "is not a positive span"),
        ("1.5s", "is not a positive span"),
        ("1m,8d", "has a delay longer than 7d"),
        (",".join(["1s"] * (MAX_RETRY_SCHEDULE + 1)), "lists more than 100 delays"),
    ],
)
def test_a_bad_schedule_on_the_command_line_is_refused(text: str, problem: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(problem)):
        retry_schedule(text)


def test_a_schedule_is_shown_as_the_command_line_reads_it() -> None:
    for text in ("5s,1m,10m,1h", "90m,1d,7d"):
        assert format_schedule(retry_schedule(text)) == text
    assert format_schedule([0.5, 2.0]) == "0.5s,2s"
    assert format_schedule(None) is None


def test_the_library_takes_delays_in_seconds() -> None:
    assert check_retry_schedule(None) is None
    assert check_retry_schedule((1, 2.5, MAX_RETRY_DELAY)) == [1.0, 2.5, MAX_RETRY_DELAY]
    assert check_retry_schedule(iter([0.05])) == [0.05]


@pytest.mark.parametrize(
    "value",
    [
        [],
        [0],
        [-1],
        [math.nan],
        [math.inf],
        [MAX_RETRY_DELAY + 1],
        [1] * (MAX_RETRY_SCHEDULE + 1),
        "5s,1m",
        ["5"],
        [True],
        [None],
        5,
    ],
)
def test_the_library_refuses_a_bad_schedule_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_retry_schedule(value)
    assert info.value.field == "retry_schedule"


@pytest.mark.parametrize("value", [None, [], [0], "1m"])
def test_an_event_types_bad_schedule_is_an_invalid_argument_naming_it(value: object) -> None:
    with invalid_argument("retry_schedule"):
        EventTypes().set(NO_TX, "order.created", retry_schedule=value)  # type: ignore[arg-type]


def test_an_event_types_bad_name_is_an_invalid_argument_naming_it() -> None:
    for call in (
        lambda: EventTypes().set(NO_TX, "a b", retry_schedule=[1.0]),
        lambda: EventTypes().get(NO_TX, ""),
        lambda: EventTypes().delete(NO_TX, "x*"),
    ):
        with invalid_argument("event_type"):
            call()


def test_the_migration_holds_the_librarys_bounds() -> None:
    text = MIGRATION.read_text()
    assert f"cardinality(VALUE) BETWEEN 1 AND {MAX_RETRY_SCHEDULE}" in text
    assert f"{MAX_RETRY_DELAY:g} >= ALL (VALUE)" in text


def test_without_a_stored_schedule_the_default_policy_applies() -> None:
    default = ExponentialBackoff()
    assert policy_for(None, default) is default


def test_a_stored_schedule_is_followed_and_its_last_delay_repeats() -> None:
    policy = policy_for([10.0, 20.0], ExponentialBackoff())
    assert isinstance(policy, Schedule)
    assert policy.delays == (10.0, 20.0)
    assert policy_for((10.0, 20.0), ExponentialBackoff()) is policy  # made once
    for attempt, nominal in [(1, 10.0), (2, 20.0), (3, 20.0), (9, 20.0)]:
        decision = decide(RETRY_503, attempts=attempt, max_attempts=10, policy=policy)
        assert decision.state == "ready"
        assert nominal * 0.9 <= decision.delay <= nominal * 1.1  # the default jitter


def test_a_stored_schedule_ends_with_the_attempt_budget() -> None:
    policy = policy_for([10.0], ExponentialBackoff())
    assert decide(RETRY_503, attempts=3, max_attempts=3, policy=policy).state == "dead"


def test_retry_after_lengthens_a_stored_schedules_delay_up_to_the_cap() -> None:
    policy = policy_for([10.0, 20.0], ExponentialBackoff())

    def delay(retry_after: float | None) -> float:
        outcome = Outcome(Verdict.RETRY, 429, "HTTP 429", "http_429", retry_after)
        return decide(outcome, attempts=1, max_attempts=5, policy=policy).delay

    assert delay(120.0) == 120.0  # later than the schedule's 10 s
    assert 9.0 <= delay(1.0) <= 11.0  # earlier: the schedule's delay stands
    assert delay(30 * 86400.0) == DEFAULT_MAX_RETRY_AFTER  # capped
