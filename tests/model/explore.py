"""Breadth-first search of every state the model can reach, and its verdict.

:func:`explore` visits each reachable state once (states are hashable tuples),
checks the state rules in it and the step rules on every step out of it, and
stops at the first violation with the shortest trace that reaches it. When
nothing is broken it checks that nothing committed can be lost: from every
reachable state some path still leads to a state where every committed message
is delivered or dead (a backward search from those states over the whole
graph); a state from which none does is reported with the trace to it.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from tests.model import invariants as rules
from tests.model.protocol import steps
from tests.model.state import Config, State, describe, initial

MOST_STATES = 2_000_000
"""A bound on the search, so that a model grown too big fails instead of
running for hours."""


@dataclass(frozen=True)
class Violation:
    """A rule broken, and the shortest trace of steps that breaks it."""

    rules: tuple[str, ...]
    trace: tuple[str, ...]  # the steps from the initial state
    state: State  # the state the trace ends in

    def __str__(self) -> str:
        steps_taken = "\n".join(f"  {n + 1:2}. {label}" for n, label in enumerate(self.trace))
        return (
            f"broken: {'; '.join(self.rules)}\n"
            f"after {len(self.trace)} steps:\n{steps_taken}\n"
            f"in the state:\n{describe(self.state)}"
        )


@dataclass(frozen=True)
class Result:
    states: int
    steps: int  # transitions examined
    violation: Violation | None


def explore(config: Config, *, waive: tuple[str, ...] = ()) -> Result:
    """Every state reachable under ``config``, checked; the first violation found
    (the shortest, as the search is breadth-first), or None.

    :param waive: rules not to hold against the protocol, by a phrase of their
        text: to see what else breaks once one (known) rule is broken.
    """
    start = initial(config)
    index: dict[State, int] = {start: 0}
    states: list[State] = [start]
    parent = array("i", [-1])
    sources = array("i")  # the graph's edges, for the backward search
    targets = array("i")
    queue = deque([0])
    examined = 0
    while queue:
        n = queue.popleft()
        state = states[n]
        broken = _counted(rules.state_rules(state), waive)
        if broken:
            return Result(len(states), examined, _violation(config, broken, n, states, parent))
        for step in steps(state, config):
            examined += 1
            broken = _counted(step.broken, waive)
            if broken:
                trace = (*_trace(config, n, states, parent), step.label)
                return Result(len(states), examined, Violation(broken, trace, step.state))
            m = index.get(step.state)
            if m is None:
                m = index[step.state] = len(states)
                states.append(step.state)
                parent.append(n)
                queue.append(m)
                if len(states) > MOST_STATES:
                    raise RuntimeError(f"more than {MOST_STATES} states: bound the model more")
            sources.append(n)
            targets.append(m)
    stuck = _first_stuck(states, sources, targets)
    if stuck is not None:
        pending = [
            m.id
            for m in states[stuck].msgs
            if m.rank is not None and m.state not in ("delivered", "dead")
        ]
        rule = f"committed m{pending} can never be delivered or dead from here"
        return Result(len(states), examined, _violation(config, (rule,), stuck, states, parent))
    return Result(len(states), examined, None)


def _counted(broken: tuple[str, ...], waive: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(rule for rule in broken if not any(phrase in rule for phrase in waive))


def _first_stuck(states: list[State], sources: array[int], targets: array[int]) -> int | None:
    """The first state (in search order) from which no settled state is reachable."""
    count = len(states)
    # the reversed graph, compressed: the predecessors of m are
    # preds[first[m]:first[m + 1]]
    first = array("i", [0]) * (count + 1)
    for m in targets:
        first[m + 1] += 1
    for m in range(count):
        first[m + 1] += first[m]
    fill = array("i", first)
    preds = array("i", [0]) * len(targets)
    for n, m in zip(sources, targets, strict=True):
        preds[fill[m]] = n
        fill[m] += 1
    good = bytearray(count)
    queue = deque(m for m in range(count) if rules.settled(states[m]))
    for m in queue:
        good[m] = 1
    while queue:
        m = queue.popleft()
        for n in preds[first[m] : first[m + 1]]:
            if not good[n]:
                good[n] = 1
                queue.append(n)
    return next((m for m in range(count) if not good[m]), None)


def _trace(config: Config, n: int, states: list[State], parent: array[int]) -> list[str]:
    """The labels of the steps from the initial state to state ``n``."""
    path = []
    while n > 0:
        path.append(n)
        n = parent[n]
    labels = []
    for m in reversed(path):
        before = states[parent[m]]
        labels.append(next(s.label for s in steps(before, config) if s.state == states[m]))
    return labels


def _violation(
    config: Config, broken: tuple[str, ...], n: int, states: list[State], parent: array[int]
) -> Violation:
    return Violation(broken, tuple(_trace(config, n, states, parent)), states[n])
