"""The delivery protocol, checked exhaustively on a model within small bounds.

Each scenario of :mod:`tests.model.scenarios` is searched whole: no rule of
:mod:`tests.model.invariants` broken in any reachable state or step, and from
every state each committed message can still end delivered or dead. Then each
seeded bug (:class:`~tests.model.state.Mutation`) is shown to be found, with the
shortest trace that exposes it, so that a pass above means something. Counts of
states are printed (``pytest -s`` shows them), never asserted.
"""

from __future__ import annotations

import time

import pytest

from tests.model.explore import Result, explore
from tests.model.scenarios import ALL, CAP, LEASES, ORDERING
from tests.model.state import Config, Mutation

CAP_EXCEEDED = "requests are in flight under a cap of"
"""The phrase of the cap rule (tests.model.invariants.claim_rules)."""


def _run(name: str, config: Config, *, waive: tuple[str, ...] = ()) -> Result:
    start = time.perf_counter()
    result = explore(config, waive=waive)
    print(
        f"{name}: {result.states} states, {result.steps} steps, {time.perf_counter() - start:.2f} s"
    )
    if result.violation is not None:
        print(result.violation)
    return result


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.slow
def test_the_protocol_as_built_breaks_no_rule(name: str) -> None:
    result = _run(name, ALL[name])
    assert result.violation is None, str(result.violation)


SEEDED = [
    pytest.param(
        LEASES, Mutation.FENCE_WITHOUT_ATTEMPT, "applied to its attempt", id="fence-without-attempt"
    ),
    pytest.param(
        ALL["redrive"],
        Mutation.ORDERING_WITHOUT_RUNNING_RULE,
        "two messages of one ordering key are in flight",
        id="ordering-without-running-rule",
    ),
    pytest.param(
        ORDERING, Mutation.IDS_WITHOUT_KEY_LOCK, "which has a larger id", id="ids-without-key-lock"
    ),
    pytest.param(
        CAP, Mutation.CAP_LOWERED_WITHOUT_RESEAT, CAP_EXCEEDED, id="cap-lowered-without-reseat"
    ),
    pytest.param(CAP, Mutation.UNSEATED_NOT_COUNTED, CAP_EXCEEDED, id="unseated-not-counted"),
    pytest.param(
        ALL["breaker"],
        Mutation.PROBE_WHILE_PROBING,
        "probes of an open breaker are in flight at once",
        id="probe-while-probing",
    ),
]


@pytest.mark.parametrize(("config", "mutation", "rule"), SEEDED)
def test_each_seeded_bug_is_found_with_a_trace(
    config: Config, mutation: Mutation, rule: str
) -> None:
    result = _run(mutation.value, config.but(mutation))
    assert result.violation is not None, f"{mutation.value}: not found"
    assert any(rule in broken for broken in result.violation.rules), str(result.violation)
    assert result.violation.trace


def test_commit_order_reaches_the_receiver_out_of_order_without_the_key_lock() -> None:
    # the end-to-end consequence of ids drawn without the lock, past the direct
    # rule that ids of a key follow commit order
    result = _run(
        "ids without the key lock, receiver's view",
        ORDERING.but(Mutation.IDS_WITHOUT_KEY_LOCK),
        waive=("which has a larger id",),
    )
    assert result.violation is not None
    assert any("reaches the receiver before" in r for r in result.violation.rules)


def test_a_message_is_lost_when_every_dispatcher_may_crash() -> None:
    # the liveness check can fail: with no dispatcher left, what is committed
    # can never be delivered
    result = _run("every dispatcher crashes", Config(committed=True, dispatchers=1, crashes=1))
    assert result.violation is not None
    assert any("can never be delivered or dead" in r for r in result.violation.rules)
