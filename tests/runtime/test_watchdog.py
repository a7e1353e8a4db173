"""When a dispatcher stops rather than retries: permanent errors that persist for
the patience, per operation, and drains without progress."""

from __future__ import annotations

import psycopg

from dispatchers.errors import DatabaseUnusable, DispatcherFailed, DrainStalled
from dispatchers.runtime.watchdog import Watchdog

PERMANENT = psycopg.errors.InsufficientPrivilege("permission denied for table messages")
TRANSIENT = psycopg.errors.AdminShutdown("terminating connection due to administrator command")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock, failures: list[DispatcherFailed]) -> Watchdog:
    return Watchdog(patience=30.0, stall=60.0, on_failure=failures.append, clock=clock)


def test_a_permanent_error_that_persists_for_the_patience_fails_once() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    dog.failed("claim", PERMANENT)
    clock.now += 29.9
    dog.failed("claim", PERMANENT)
    assert failures == []
    clock.now += 0.1
    dog.failed("claim", PERMANENT)
    dog.failed("claim", PERMANENT)
    [failure] = failures
    assert isinstance(failure, DatabaseUnusable)
    assert dog.failure is failure
    assert str(failure) == (
        "claim met a permanent database error for 30 s: "
        "permission denied for table messages (SQLSTATE 42501)"
    )


def test_an_answer_starts_the_count_over() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    dog.failed("complete", PERMANENT)
    clock.now += 20
    dog.answered("complete")
    clock.now += 20
    dog.failed("complete", PERMANENT)
    assert failures == []
    clock.now += 30
    dog.failed("complete", PERMANENT)
    assert len(failures) == 1


def test_transient_errors_neither_start_nor_end_the_count() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    for _ in range(10):
        dog.failed("renew", TRANSIENT)
        clock.now += 10
    assert failures == []
    dog.failed("renew", PERMANENT)
    clock.now += 15
    dog.failed("renew", TRANSIENT)
    clock.now += 15
    dog.failed("renew", PERMANENT)
    assert len(failures) == 1


def test_each_operation_keeps_its_own_count() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    dog.failed("complete", PERMANENT)
    for _ in range(4):
        clock.now += 10
        dog.answered("claim")  # claims still answer; outcome writes still fail
    dog.failed("complete", PERMANENT)
    assert [str(f).split(" ")[0] for f in failures] == ["complete"]


def test_a_drain_without_progress_for_the_stall_fails_naming_the_last_error() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    clock.now += 50
    dog.progressed()
    clock.now += 59
    dog.check_stall()
    assert failures == []
    dog.failed("claim", TRANSIENT)
    clock.now += 1
    dog.check_stall()
    [failure] = failures
    assert isinstance(failure, DrainStalled)
    assert str(failure) == (
        "the drain made no progress for 60 s (--drain-timeout 60); last database error: "
        "terminating connection due to administrator command (SQLSTATE 57P01)"
    )


def test_a_stalled_drain_whose_database_answers_names_no_error() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    dog.failed("drain_check", TRANSIENT)
    dog.answered("drain_check")
    clock.now += 60
    dog.check_stall()
    assert [str(f) for f in failures] == [
        "the drain made no progress for 60 s (--drain-timeout 60)"
    ]


def test_an_interrupted_drain_fails_only_while_the_database_fails() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    dog.failed("claim", TRANSIENT)
    dog.answered("claim")
    dog.check_interrupted()
    assert failures == []
    dog.failed("claim", TRANSIENT)
    dog.check_interrupted()
    [failure] = failures
    assert isinstance(failure, DatabaseUnusable)
    assert "stopped before the drain finished" in str(failure)


def test_the_error_named_is_the_latest_of_an_operation_still_failing() -> None:
    clock, failures = Clock(), []
    dog = watchdog(clock, failures)
    dog.failed("claim", PERMANENT)
    dog.failed("retention", TRANSIENT)
    dog.answered("retention")
    assert dog.last_error is PERMANENT
    dog.failed("renew", TRANSIENT)
    dog.failed("claim", PERMANENT)  # failing again: now the latest
    assert dog.last_error is PERMANENT
    dog.answered("claim")
    assert dog.last_error is TRANSIENT
    dog.answered("renew")
    assert dog.last_error is None
