"""Endpoints that filter on the payload: ``publish`` writes a message for the
endpoints whose filter the payload passes, on every transaction kind, a filter
refused when it is saved writes nothing, and a filter that runs over its budget
on a payload misses that event alone."""

from __future__ import annotations

import logging
import tracemalloc

import psycopg
import pytest

from outbox import InvalidMessage, Outbox
from outbox.endpoints import Endpoints
from tests.transactions import Observer, Tx


def recipients(observer: Observer, ids: list[int]) -> set[str]:
    """The URLs of the endpoints the messages ``ids`` go to."""
    rows = observer.execute(
        "SELECT e.url FROM outbox.messages AS m JOIN outbox.endpoints AS e"
        " ON e.id = m.endpoint_id WHERE m.id = ANY (%s)",
        (ids,),
    )
    return {url for (url,) in rows}


async def test_publish_writes_messages_only_for_the_endpoints_whose_filter_passes(
    tx: Tx, database_url: str, observer: Observer
) -> None:
    endpoints = Endpoints()
    with psycopg.connect(database_url) as conn:
        for name, event_types, payload_filter in [
            ("big", ["order.paid"], "amount > `100`"),
            ("small", ["order.*"], "amount <= `100`"),
            ("all", ["order.paid"], None),
            ("refunds", ["order.refunded"], "amount > `0`"),
            ("broken", ["order.paid"], "length(amount) > `1`"),  # fails: no match
        ]:
            endpoints.add(
                conn,
                url=f"https://{name}.example.com/",
                event_types=event_types,
                filter=payload_filter,
            )
        conn.commit()
    box = Outbox()

    big = await tx.call(box.publish, box.publish_async, "order.paid", {"amount": 150})
    small = await tx.call(
        box.publish, box.publish_async, "order.paid", {"amount": 50}, idempotency_key="e-50"
    )
    again = await tx.call(
        box.publish, box.publish_async, "order.paid", {"amount": 50}, idempotency_key="e-50"
    )
    await tx.commit()

    assert recipients(observer, big) == {"https://big.example.com/", "https://all.example.com/"}
    assert recipients(observer, small) == {
        "https://small.example.com/",
        "https://all.example.com/",
    }
    assert again == small
    ((messages,),) = observer.execute("SELECT count(*) FROM outbox.messages").fetchall()
    assert messages == 4


def test_a_refused_filter_writes_nothing_and_an_update_can_clear_it(database_url: str) -> None:
    endpoints = Endpoints()
    with psycopg.connect(database_url) as conn:
        with pytest.raises(InvalidMessage, match="filter: syntax error at character 9"):
            endpoints.add(conn, url="https://example.com/", filter="amount >")
        assert conn.execute("SELECT count(*) FROM outbox.endpoints").fetchone() == (0,)

        saved = endpoints.add(conn, url="https://example.com/", filter="amount > `1`")
        with pytest.raises(InvalidMessage, match=r"filter: unknown function total\(\)"):
            endpoints.update(conn, saved.id, description="changed", filter="total(@)")
        assert endpoints.require(conn, saved.id) == saved

        changed = endpoints.update(conn, saved.id, filter="amount > `2`")
        cleared = endpoints.update(conn, saved.id, clear_filter=True)
    assert (changed.filter, cleared.filter) == ("amount > `2`", None)
    assert changed.as_dict()["filter"] == "amount > `2`"


def test_a_filter_over_budget_misses_the_event_and_the_others_still_get_it(
    database_url: str, observer: Observer, caplog: pytest.LogCaptureFixture
) -> None:
    # saved as valid: each layer JSON-encodes the one inside, escaping every
    # quote, so the text doubles twelve times (512 million characters unbounded)
    doubling = "to_string(to_array(" * 12 + "a" + "))" * 12
    endpoints = Endpoints()
    with psycopg.connect(database_url) as conn:
        for name, payload_filter in [("hostile", doubling), ("plain", "a"), ("all", None)]:
            endpoints.add(
                conn,
                url=f"https://{name}.example.com/",
                event_types=["order.paid"],
                filter=payload_filter,
            )
        conn.commit()
        box = Outbox()
        tracemalloc.start()
        try:
            with caplog.at_level(logging.WARNING, logger="outbox.filters"):
                ids = box.publish(conn, "order.paid", {"a": '"' * 125_000})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        conn.commit()

    assert recipients(observer, ids) == {"https://plain.example.com/", "https://all.example.com/"}
    assert [r.getMessage() for r in caplog.records if r.name == "outbox.filters"] == [
        "an endpoint filter failed on an event of type order.paid (over budget: more than "
        f"1,000,000 characters of text) and counts as no match: {doubling!r}"
    ]
    # the publish's own copies of a 250 KB payload, and no more than a few MB besides
    assert peak < 32 * 1024 * 1024
