"""Each check of the history checker catches its violation in a small hand-made
history, and passes the same history told right (pure logic: no database, no
process)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tests.history.checks import CHECKS, check, facts
from tests.history.checks.facts import when
from tests.history.fence import FENCED
from tests.history.history import LockWait, Operation, Process
from tests.history.receiver import Spec, behavior
from tests.history.report import exercised
from tests.history.store import dump, load
from tests.history.story import T0, URL, Story
from tests.history.violation import CAP_CHANGE_DEFECT
from tests.history.workload import ARRANGED_KINDS, plan


def found(story: Story, name: str, **changes: object) -> list[str]:
    return [v.message for v in CHECKS[name](facts(story.history(**changes)))]


def delivered_twice_in_order() -> Story:
    s = Story()
    s.commit(1.0, (1, "k1", "acct"))
    s.commit(2.0, (2, "k2", "acct"))
    s.deliver(3.0, 1)
    s.deliver(4.0, 2, app="d2")
    return s


def test_a_clean_history_breaks_no_rule() -> None:
    assert check(delivered_twice_in_order().history()) == []


def test_settled_catches_a_committed_message_left_ready_and_one_dead_without_reason() -> None:
    s = delivered_twice_in_order()
    s.commit(5.0, (3, "k3", None))
    assert found(s, "settled") == [
        "m3 to http://127.0.0.1:9000 is still ready after the run "
        "settled (attempts 0/5, last error None)"
    ]
    s.claim(6.0, 3)
    s.request(3, 6.01, 6.02, status=422)
    s.end(6.1, 3, "dead")
    assert found(s, "settled") == []
    s.finals[3] = dataclasses.replace(s.finals[3], last_error=None)
    assert found(s, "settled") == ["m3 is dead without a reason"]


def test_settled_catches_a_message_dead_before_its_attempts_were_spent() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.claim(2.0, 1)
    s.request(1, 2.01, 2.02, status=500)
    s.end(2.1, 1, "dead")
    s.attempts[-1] = dataclasses.replace(s.attempts[-1], outcome="retry")
    assert "after 1 of 5 attempts" in found(s, "settled")[0]


def test_nothing_rolled_back_sent_catches_a_write_and_a_request_of_a_rolled_back_key() -> None:
    s = delivered_twice_in_order()
    xid = s.commit(5.0, (3, "k3", None), committed=False)
    assert found(s, "nothing_rolled_back_sent") == []
    s.requests.append(dataclasses.replace(s.requests[0], key="k3", arrival=T0 + 6))
    assert found(s, "nothing_rolled_back_sent") == [
        "a received key 'k3', which no committed message has"
    ]
    s.requests.pop()
    s._event(4.99, "insert", 3, "producer-1", xid=xid, idempotency_key="k3", target=f"{URL}/a")
    assert "did not commit (rollback), yet wrote [3]" in found(s, "nothing_rolled_back_sent")[0]


def test_nothing_rolled_back_sent_catches_an_arrival_before_the_commit() -> None:
    s = Story()
    s.commit(5.0, (1, "k1", None))
    s.claim(5.1, 1)
    s.request(1, 4.9, 5.2)
    s.end(5.3, 1, "delivered")
    assert "before its transaction's commit was sent" in found(s, "nothing_rolled_back_sent")[0]


def test_commit_follows_ids_catches_ids_against_commit_order() -> None:
    s = Story()
    s.commit(2.0, (2, "k2", "acct"))
    s.commit(1.0, (1, "k1", "acct"), producer=2)
    assert found(s, "commit_follows_ids") == []
    s.txns[1] = dataclasses.replace(s.txns[1], commit_sent=T0 + 3.0)
    assert "m2 committed" in found(s, "commit_follows_ids")[0]


def test_first_arrivals_follow_commit_order_catches_a_later_message_first() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", "acct"))
    s.commit(2.0, (2, "k2", "acct"))
    s.deliver(4.0, 1)
    s.deliver(3.0, 2)
    assert "m2 first arrived" in found(s, "first_arrivals_follow_commit_order")[0]
    # an earlier message that went dead first holds none back
    t = Story()
    t.commit(1.0, (1, "k1", "acct"))
    t.commit(2.0, (2, "k2", "acct"))
    t.claim(2.5, 1)
    t.end(2.6, 1, "dead", status=None)
    t.deliver(3.0, 2)
    assert found(t, "first_arrivals_follow_commit_order") == []


def test_one_message_of_a_key_in_flight_catches_overlapping_leases() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", "acct"), (2, "k2", "acct"))
    s.claim(2.0, 1)
    s.claim(2.1, 2, app="d2")
    s.end(2.5, 1, "delivered")
    s.end(2.6, 2, "delivered", app="d2")
    assert "m2 was claimed while m1 was running" in found(s, "one_message_of_a_key_in_flight")[0]


def test_redelivery_is_allowed_after_a_rescue_and_caught_after_an_answer() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.claim(2.0, 1)
    s.request(1, 2.1, 2.2)  # answered, but its owner died before writing it
    s.end(5.0, 1, "rescued", app="d2")
    s.claim(5.1, 1, app="d2")
    s.request(1, 5.2, 5.3)
    s.end(5.4, 1, "delivered", app="d2")
    assert found(s, "redelivered_only_after_open_attempt") == []
    # a request the same attempt sent twice: nothing accounts for the second
    s.request(1, 5.25, 5.3)
    assert "that no attempt accounts for" in found(s, "redelivered_only_after_open_attempt")[0]


def test_a_request_after_its_answered_lease_ended_is_caught_but_not_after_a_timeout() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.claim(2.0, 1)
    s.end(3.0, 1, "ready", status=None)  # timed out: the request may still be on its way
    s.request(1, 3.1, 3.2)
    s.claim(4.0, 1)
    s.request(1, 4.1, 4.2)
    s.end(4.5, 1, "delivered")
    assert found(s, "redelivered_only_after_open_attempt") == []
    s.attempts[0] = dataclasses.replace(s.attempts[0], status=500)  # it was answered
    assert found(s, "redelivered_only_after_open_attempt")


def test_effects_applied_once_catches_an_effect_applied_twice_and_one_missing() -> None:
    s = delivered_twice_in_order()
    s.destinations = [dataclasses.replace(s.destinations[0], inbox=True)]
    s.effects = {"k1": 1, "k2": 1}
    assert found(s, "effects_applied_once") == []
    s.effects = {"k1": 2}
    assert found(s, "effects_applied_once") == [
        "the inbox applied key 'k1' 2 times",
        "m1 was delivered to the inbox but its effect was applied 2 times",
        "m2 was delivered to the inbox but its effect was applied 0 times",
    ]


def test_completion_fenced_catches_an_outcome_written_by_a_fenced_out_owner() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.claim(2.0, 1, app="d1")
    s.request(1, 2.1, 2.2)
    s.end(2.5, 1, "delivered", app="d2")  # d2 did not hold this lease
    messages = found(s, "completion_fenced")
    assert "d2 wrote the outcome (delivered) of a lease d1 held" in messages[0]


def test_completion_fenced_catches_a_rescue_of_a_live_lease_and_a_stray_attempt_row() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.claim(2.0, 1, lease=10.0)
    s.end(3.0, 1, "rescued", app="d2")  # the lease ran until 12
    s.claim(3.5, 1, app="d2")
    s.request(1, 3.6, 3.7)
    s.end(4.0, 1, "delivered", app="d2")
    assert "though it ran until" in found(s, "completion_fenced")[0]
    t = delivered_twice_in_order()
    t.attempts[0] = dataclasses.replace(t.attempts[0], owner="d9-owner")
    assert "names d9-owner, but d1-owner held that attempt" in found(t, "completion_fenced")[0]


def moved_back() -> Story:
    """m1 delivered, replayed by an operator and delivered again; m2 dead on a
    422, retried by an operator and delivered: both under their own keys."""
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.deliver(2.0, 1)
    s.claim(2.2, 2)
    s.request(2, 2.25, 2.3, status=422)
    s.end(2.4, 2, "dead")
    s.reopen(3.0, 1, "replay", xid=900)
    s.reopen(3.0, 2, "dead_retry", xid=901)
    s.deliver(3.5, 1, app="d2")
    s.deliver(3.6, 2, app="d2")
    return s


OPERATIONS = (
    Operation("replay", (1,), 900, T0 + 2.9, T0 + 3.1, 1),
    Operation("dead_retry", (2,), 901, T0 + 2.9, T0 + 3.1, 1),
)


def test_a_replay_and_a_dead_retry_by_an_operator_break_no_rule_and_are_counted() -> None:
    history = moved_back().history(operations=OPERATIONS)
    assert check(history) == []
    counted = exercised(facts(history))
    assert (counted["replayed"], counted["dead_retried"]) == (1, 1)


def test_completion_fenced_catches_a_message_moved_back_by_no_operator_or_renumbered() -> None:
    assert found(moved_back(), "completion_fenced") == [
        f"m1 was replayed (inserted again) at {when(T0 + 3.0)} by history-operator "
        "(xid 900), which no operator's replay was",
        f"m2 was moved from dead to ready at {when(T0 + 3.0)} by history-operator "
        "(xid 901), which no operator's dead_retry was",
    ]
    s = moved_back()
    retry = next(i for i, e in enumerate(s.events) if e.old_state == "dead")
    s.events[retry] = dataclasses.replace(s.events[retry], new_attempts=0)
    assert found(s, "completion_fenced", operations=OPERATIONS)[0] == (
        f"m2 was moved from dead to ready at {when(T0 + 3.0)} by history-operator "
        "(xid 901), its attempts not kept"
    )


def test_completion_fenced_catches_a_final_outcome_before_the_last_attempt() -> None:
    # delivered, then sent again with no replay in between
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.deliver(2.0, 1)
    s.claim(3.0, 1, app="d2")
    s.request(1, 3.1, 3.2)
    s.end(3.3, 1, "delivered", app="d2")
    assert "a final outcome before its last attempt: ['delivered']" in " ".join(
        found(s, "completion_fenced")
    )


def test_reopened_sent_again_catches_a_replay_never_sent_and_a_command_miscounted() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.deliver(2.0, 1)
    s.reopen(3.0, 1, "replay", xid=900)
    miscounted = (dataclasses.replace(OPERATIONS[0], moved=2),)
    assert found(s, "reopened_sent_again", operations=miscounted) == [
        f"m1 moved back (replay) at {when(T0 + 3.0)} was never claimed again",
        "the operator's replay of [1] (xid 900) reported 2 moved back, the audit shows [1]",
    ]
    s.claim(3.5, 1, app="d2")  # claimed, but no request with its key came after
    s.end(3.9, 1, "ready", app="d2", status=None)
    assert found(s, "reopened_sent_again", operations=OPERATIONS[:1]) == [
        f"m1 moved back (replay) at {when(T0 + 3.0)} was never received again"
    ]


def test_a_lease_given_up_counts_as_fenced_only_once_another_ended_it() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None))
    s.claim(2.0, 1)
    s.request(1, 2.1, 2.2)  # answered; its owner stopped before writing it
    s.end(5.0, 1, "rescued", app="d2")
    s.deliver(5.1, 1, app="d2")
    d1 = Process("d1", 1, "d1-owner", T0, T0 + 9, 0, "terminated", lost=((1, 1, FENCED),))
    history = s.history(processes=(d1,))
    assert found(s, "completion_fenced", processes=(d1,)) == []
    counted = exercised(facts(history))
    assert (counted["lost_leases"], counted["fenced_outcomes"], counted["given_up"]) == (1, 1, 1)
    # a lease its owner says it lost, though nobody else ended it
    t = delivered_twice_in_order()
    assert found(t, "completion_fenced", processes=(d1,)) == [
        "d1 gave m1@1 up (outcome fenced out) though no other ended its lease"
    ]
    assert exercised(facts(t.history(processes=(d1,))))["fenced_outcomes"] == 0


def test_contended_keys_count_locks_two_producers_waited_for_at_once() -> None:
    waits = (
        LockWait(T0 + 1, "0:1", ("producer-1",)),
        LockWait(T0 + 1, "0:2", ("d1", "d2")),  # dispatchers, not producers
        LockWait(T0 + 2, "0:1", ("producer-1", "producer-2")),
        LockWait(T0 + 3, "0:1", ("producer-2", "producer-3")),
    )
    history = delivered_twice_in_order().history(lock_waits=waits)
    assert exercised(facts(history))["contended_keys"] == 1
    alone = dataclasses.replace(history, lock_waits=waits[:2])
    assert exercised(facts(alone))["contended_keys"] == 0


def capped(cap_change: bool) -> Story:
    """Three requests in flight together at a destination capped at 2 (or capped
    at 3, lowered to 1 while two of them ran)."""
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None), (3, "k3", None))
    s.policy(0.0, cap=3 if cap_change else 2)
    s.claim(2.0, 1)
    s.claim(2.0, 2, app="d2")
    if cap_change:
        s.policy(2.3, cap=1)
    s.request(1, 2.1, 3.0)
    s.request(2, 2.1, 3.0)
    s.claim(2.5, 3, app="d3")
    s.request(3, 2.6, 3.0)
    for mid, app in ((1, "d1"), (2, "d2"), (3, "d3")):
        s.end(3.1, mid, "delivered", app=app)
    return s


def test_cap_at_receiver_catches_more_in_flight_than_the_cap() -> None:
    violations = CHECKS["cap_at_receiver"](facts(capped(False).history()))
    assert [v.message.split(" at ")[0] for v in violations] == ["a: 3 requests in flight"]
    assert violations[0].known is None


def test_cap_at_receiver_marks_a_cap_lowered_under_running_requests_as_the_known_defect() -> None:
    violations = CHECKS["cap_at_receiver"](facts(capped(True).history()))
    assert len(violations) == 1 and violations[0].known == CAP_CHANGE_DEFECT


def test_at_cap_counts_arrivals_that_filled_the_cap_in_force() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.policy(0.0, cap=2)
    s.claim(2.0, 1)
    s.claim(2.0, 2, app="d2")
    s.request(1, 2.1, 2.9)
    s.request(2, 2.2, 2.9)
    s.end(3.0, 1, "delivered")
    s.end(3.0, 2, "delivered", app="d2")
    assert exercised(facts(s.history()))["at_cap"] == 1
    s.policies[0] = dataclasses.replace(s.policies[0], cap=3)
    assert exercised(facts(s.history()))["at_cap"] == 0


def test_cap_at_receiver_allows_the_cap_in_force_when_the_running_ones_were_claimed() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.policy(0.0, cap=2)
    s.claim(2.0, 1)
    s.claim(2.0, 2, app="d2")
    s.request(1, 2.1, 2.9)
    s.request(2, 2.1, 2.9)
    s.policy(2.5, cap=1)  # lowered while both run: they finish, nothing new starts
    s.end(3.0, 1, "delivered")
    s.end(3.0, 2, "delivered", app="d2")
    assert found(s, "cap_at_receiver") == []


def test_rate_within_limit_catches_starts_above_burst_plus_rate_times_window() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None), (3, "k3", None))
    s.policy(0.0, rate=1.0, burst=1)
    for i, mid in enumerate((1, 2)):
        s.deliver(2.0 + i * 1.0, mid)
    assert found(s, "rate_within_limit") == []
    s.deliver(3.5, 3)  # a third start 1.5 s after the first: at most 1 + 1.5
    assert "3 claims from" in found(s, "rate_within_limit")[0]


def test_claims_respect_breaker_catches_a_claim_while_open_but_not_the_probe() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.breaker(2.0, None, "open", until=3.0)
    s.breaker(3.5, "open", "probing", until=5.5, xid=500)
    s.claim(3.5, 1, xid=500, txn_start=3.49)  # the probe, in the same transaction
    s.request(1, 3.6, 3.7)
    s.end(3.8, 1, "delivered")
    assert found(s, "claims_respect_breaker") == []
    s.claim(4.0, 2, app="d2")  # not a probe, while the row says probing
    s.request(2, 4.1, 4.2)
    s.end(4.3, 2, "delivered", app="d2")
    assert "m2 claimed at" in found(s, "claims_respect_breaker")[0]


def test_one_probe_at_a_time_catches_a_second_probe_while_the_first_runs() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.breaker(2.0, None, "open", until=3.0)
    s.breaker(3.5, "open", "probing", until=5.5, xid=500)
    s.claim(3.5, 1, xid=500, txn_start=3.49, lease=10.0)
    s.breaker(3.7, "probing", "probing", until=6.0, xid=501)
    s.claim(3.7, 2, app="d2", xid=501, txn_start=3.69)
    s.request(1, 3.6, 4.0)
    s.request(2, 3.8, 4.0)
    s.end(4.1, 1, "delivered")
    s.end(4.1, 2, "delivered", app="d2")
    messages = found(s, "one_probe_at_a_time")
    assert any("from state probing blocked until" in m for m in messages)
    assert any("two probe requests at the receiver at once" in m for m in messages)


def test_a_probe_answered_but_not_yet_written_is_no_longer_in_flight() -> None:
    # the prober writes the probe's answer (open again) and freezes before its
    # outcome batch: the next probe, once the back-off passes, is no second one
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.breaker(2.0, None, "open", until=3.0)
    s.breaker(3.5, "open", "probing", until=6.5, xid=500)
    s.claim(3.5, 1, xid=500, txn_start=3.49, lease=3.0)
    s.request(1, 3.55, 3.6, status=503)
    s.breaker(3.65, "probing", "open", until=4.0)
    s.breaker(4.1, "open", "probing", until=7.1, xid=501)
    s.claim(4.1, 2, app="d2", xid=501, txn_start=4.09)
    s.request(2, 4.15, 4.2)
    s.end(4.3, 2, "delivered", app="d2")
    s.end(7.0, 1, "rescued", app="d2")
    assert found(s, "one_probe_at_a_time") == []


def test_one_probe_at_a_time_catches_a_probe_claim_of_two_messages() -> None:
    s = Story()
    s.commit(1.0, (1, "k1", None), (2, "k2", None))
    s.breaker(2.0, None, "open", until=3.0)
    s.breaker(3.5, "open", "probing", until=5.5, xid=500)
    s.claim(3.5, 1, xid=500, txn_start=3.49)
    s.claim(3.5, 2, xid=500, txn_start=3.49)
    assert "claimed 2 of its messages" in found(s, "one_probe_at_a_time")[0]


def test_webhooks_signed_and_dispatchers_stop_cleanly_catch_theirs() -> None:
    s = delivered_twice_in_order()
    s.requests[0] = dataclasses.replace(s.requests[0], signature=False)
    assert found(s, "webhooks_signed")
    p = Process("d1", 1, "d1-owner", T0, T0 + 9, 1, "terminated")
    assert found(s, "dispatchers_stop_cleanly", processes=(p,)) == [
        "d1 (pid 1) exited 1 on SIGTERM"
    ]


def test_a_history_survives_json(tmp_path: Path) -> None:
    d1 = Process("d1", 1, "d1-owner", T0, None, None, "running", {"x": 1}, ((1, 1, FENCED),))
    history = capped(True).history(
        operations=OPERATIONS,
        lock_waits=(LockWait(T0, "0:1", ("producer-1", "producer-2")),),
        processes=(d1,),
    )
    dump(history, tmp_path / "h.json")
    assert load(tmp_path / "h.json") == history
    assert json.loads((tmp_path / "h.json").read_text())["seed"] == 0


def test_a_seed_makes_one_plan_and_one_answer_per_request() -> None:
    assert plan(7) == plan(7) and plan(7) != plan(8)
    assert plan(3, short=True).faults == plan(4, short=True).faults
    spec = Spec("inbox", fault_rate=0.5, weights={"fail": 1.0, "hang": 1.0})
    answers = [behavior(1, spec, f"k{i}", 0, 0) for i in range(200)]
    assert answers == [behavior(1, spec, f"k{i}", 0, 0) for i in range(200)]
    assert {"fail", "hang", "ok"} <= set(answers)
    assert behavior(1, spec, "poison-x", 0, 0) == "poison"
    assert [behavior(1, spec, "lapsed-x", n, 0) for n in range(2)] == ["lapsed"] * 2
    assert behavior(1, spec, "lapsed-x", 2, 0) != "lapsed"
    assert all(behavior(1, spec, f"k{i}", 0, 2) in ("ok", "slow") for i in range(50))


def test_a_short_plan_arranges_what_the_ci_seed_asserts_early() -> None:
    p = plan(1, short=True)
    assert set(ARRANGED_KINDS) <= p.faults
    first = {s.kind: s.at for s in reversed(p.steps)}
    assert {"fence", "contend", "lapse", "dead_retry", "replay"} <= set(first)
    assert first["lapse"] < first["dead_retry"] and max(first[k] for k in ARRANGED_KINDS) < 7
