"""The real statements conform to the model: seeded walks of the model's actions
run on PostgreSQL (:mod:`tests.model.conformance`), the database compared with
the model's state after every step; and each of four bugs planted in the SQL
makes the walks fail, so that a pass means something. Each scenario's budget
here is short; ``python -m tests.model.conformance`` runs 2,000 walks of each."""

from __future__ import annotations

import time

import pytest

from tests.model import conformance
from tests.model.scenarios import CONFORMANCE

WALKS = 30
"""Walks per scenario (a few seconds each on one server); the planted bugs are
found within 17 walks with these seeds."""
LENGTH = 40
PLANTED_WALKS = 50


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFORMANCE))
async def test_the_statements_do_what_the_model_does(name: str, database_url: str) -> None:
    started = time.monotonic()
    failed, tally = await conformance.check(
        database_url, CONFORMANCE[name], walks=WALKS, length=LENGTH
    )
    print(
        f"{name}: {tally.walks} walks, {tally.steps} steps, {len(tally.states)} states,"
        f" {len(tally.kinds)} kinds of step, {time.monotonic() - started:.1f} s"
    )
    assert failed is None, str(failed)


PLANTED = [
    pytest.param(
        "complete_updated_attempt",
        "leases",
        "Key (message_id, attempt)",
        id="fence-without-attempt",
    ),
    pytest.param(
        "ordering_later_running_ignored", "redrive", "the model allows nothing", id="ordering"
    ),
    pytest.param("cap_reseated_none", "cap", "slots [", id="cap-lowered-without-reseat"),
    pytest.param(
        "enqueue_id_before_the_lock", "keys", "below an id drawn before it", id="id-before-lock"
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("mutant", "name", "found"), PLANTED)
async def test_a_bug_planted_in_the_sql_makes_the_walks_fail(
    mutant: str, name: str, found: str, database_url: str
) -> None:
    """The mutant of ``tests.mutation.sql_mutants`` made in a copy of the SQL that
    this process loads for the test's length; the walks must part from the model
    within the suite's budget, and the shrunk walk must say where."""
    with conformance.planted(mutant):
        failed, tally = await conformance.check(
            database_url, CONFORMANCE[name], walks=PLANTED_WALKS, length=LENGTH, shrinks=40
        )
    assert failed is not None, f"{mutant} passed {tally.walks} walks of {name}"
    print(
        f"{mutant}: found in walk {tally.walks}, shrunk to {len(failed.actions)} actions\n{failed}"
    )
    assert found in str(failed.failure)
