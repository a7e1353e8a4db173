"""``decide`` knows every verdict by name and decides none it does not know: a
verdict outside :class:`Verdict` (a value a newer classifier might produce, or
one read back from elsewhere) raises, naming the value, rather than deciding
nothing and leaving the message in whatever state the caller assumes."""

from __future__ import annotations

from typing import cast

import pytest

from dispatchers.delivery.outcome import Outcome, Verdict, decide
from dispatchers.delivery.retry import STANDARD_WEBHOOKS_SCHEDULE


def test_a_verdict_decide_does_not_know_raises_naming_it() -> None:
    outcome = Outcome(cast(Verdict, "postponed"), None, None, None, None)
    with pytest.raises(AssertionError, match="'postponed'"):
        decide(outcome, attempts=1, max_attempts=8, policy=STANDARD_WEBHOOKS_SCHEDULE)


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict_is_decided(verdict: Verdict) -> None:
    outcome = Outcome(verdict, None, None, None, None)
    decision = decide(outcome, attempts=1, max_attempts=8, policy=STANDARD_WEBHOOKS_SCHEDULE)
    assert decision.state in ("delivered", "ready", "dead")
