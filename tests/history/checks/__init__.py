"""The checks: plain functions of a recorded history, each returning the
violations it found (an empty list: none).

``CHECKS`` lists them by name, in the order a report shows them; ``check`` runs
them all on one history. Each takes :class:`~tests.history.checks.facts.Facts`,
the history with its leases and its requests tied to them (``facts(history)``).
"""

from __future__ import annotations

from collections.abc import Callable

from tests.history.checks.delivery import (
    commit_follows_ids,
    effects_applied_once,
    first_arrivals_follow_commit_order,
    nothing_rolled_back_sent,
    one_message_of_a_key_in_flight,
    redelivered_only_after_open_attempt,
    reopened_sent_again,
    settled,
    webhooks_signed,
)
from tests.history.checks.facts import Facts, facts
from tests.history.checks.fencing import completion_fenced
from tests.history.checks.policies import (
    cap_at_receiver,
    claims_respect_breaker,
    one_probe_at_a_time,
    rate_within_limit,
)
from tests.history.history import History
from tests.history.violation import Violation

Check = Callable[[Facts], list[Violation]]


def dispatchers_stop_cleanly(f: Facts) -> list[Violation]:
    """A dispatcher ends only when told: SIGTERM stops it with exit 0; none exits
    on its own while the run goes on."""
    out = []
    for p in f.history.processes:
        if p.how == "terminated" and p.exit_code != 0:
            out.append(
                Violation(
                    "dispatchers_stop_cleanly",
                    f"{p.name} (pid {p.pid}) exited {p.exit_code} on SIGTERM",
                )
            )
        elif p.how == "exited":
            out.append(
                Violation(
                    "dispatchers_stop_cleanly",
                    f"{p.name} (pid {p.pid}) exited {p.exit_code} on its own",
                )
            )
    return out


CHECKS: dict[str, Check] = {
    "settled": settled,
    "nothing_rolled_back_sent": nothing_rolled_back_sent,
    "commit_follows_ids": commit_follows_ids,
    "first_arrivals_follow_commit_order": first_arrivals_follow_commit_order,
    "one_message_of_a_key_in_flight": one_message_of_a_key_in_flight,
    "redelivered_only_after_open_attempt": redelivered_only_after_open_attempt,
    "effects_applied_once": effects_applied_once,
    "reopened_sent_again": reopened_sent_again,
    "completion_fenced": completion_fenced,
    "cap_at_receiver": cap_at_receiver,
    "rate_within_limit": rate_within_limit,
    "claims_respect_breaker": claims_respect_breaker,
    "one_probe_at_a_time": one_probe_at_a_time,
    "webhooks_signed": webhooks_signed,
    "dispatchers_stop_cleanly": dispatchers_stop_cleanly,
}


def check(history: History) -> list[Violation]:
    """Every check's violations on ``history``."""
    known = facts(history)
    return [v for fn in CHECKS.values() for v in fn(known)]


__all__ = ["CHECKS", "Check", "Facts", "Violation", "check", "facts"]
