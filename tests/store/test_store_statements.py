"""Which statement the Store sends for a claim and for a batch of outcomes
(no database: the choice is made before anything is sent)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dispatchers.runtime.config import DispatcherConfig
from dispatchers.store.postgres import Completion, Store


def success(message_id: int, **overrides: Any) -> Completion:
    fields: dict[str, Any] = {
        "id": message_id,
        "attempt": 1,
        "state": "delivered",
        "outcome": "delivered",
        "sent": True,
        "status": 200,
        "started_at": datetime.now(UTC),
        "duration_ms": 3,
    }
    fields.update(overrides)
    return Completion(**fields)


@pytest.fixture
def store() -> Store:
    return Store("postgresql://unused.invalid/outbox", DispatcherConfig(schema="tenant_a"))


def test_a_batch_of_sent_successes_takes_the_lean_completion(store: Store) -> None:
    batch = [success(1), success(2, endpoint_id=7)]
    statement, params = store.complete_statement("owner", batch)
    assert statement is store.queries["complete_delivered"]
    assert '"tenant_a".messages' in statement.text
    assert (params["ids"], params["endpoint_ids"]) == ([1, 2], [None, 7])
    assert params["owner"] == "owner"


@pytest.mark.parametrize(
    "other",
    [
        success(2, state="ready", outcome="retry", status=500, delay=5.0),
        success(2, state="dead", outcome="failed", status=400),
        success(2, state="ready", outcome="released", sent=False),
    ],
)
def test_any_other_outcome_takes_the_general_completion(store: Store, other: Completion) -> None:
    statement, params = store.complete_statement("owner", [success(1), other])
    assert statement is store.queries["complete"]
    assert params["ids"] == [1, 2]


def test_claim_takes_the_slots_only_when_told_that_caps_exist(store: Store) -> None:
    assert store.claim_statement("o", 5, capped=False)[0] is store.queries["claim_uncapped"]
    statement, params = store.claim_statement("o", 5, capped=True)
    assert statement is store.queries["claim"]
    assert params == {
        "owner": "o",
        "limit": 5,
        "lease_s": store.config.lease,
        "per_destination": store.config.per_destination,
        "busy": [],
        "busy_counts": [],
        "alone": None,
    }


def test_claim_leaves_less_room_at_destinations_with_requests_in_flight(store: Store) -> None:
    busy = {"https://a.example:443": 3, "endpoint:7": 1}
    _, params = store.claim_statement("o", 5, capped=False, busy=busy)
    assert dict(zip(params["busy"], params["busy_counts"], strict=True)) == busy
