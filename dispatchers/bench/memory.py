"""The ``memory`` scenario: drain-http at concurrency 256, then 1,024, against a
receiver that answers late and a share of the requests with a huge body: every
message delivered once, and the peak RSS of the dispatcher doing it."""

from __future__ import annotations

import dataclasses

from dispatchers.bench.context import Bench
from dispatchers.bench.drain import drain_once
from dispatchers.bench.measure import MB
from dispatchers.bench.receiver import Replies
from dispatchers.bench.receiver_process import ReceiverProcess
from dispatchers.bench.results import DrainRun, MemoryResult

MEMORY_CONCURRENCY = (256, 1024)
"""The memory scenario's drains: the first has the peak RSS target."""


def memory(bench: Bench) -> MemoryResult:
    """drain-http of ``memory_messages`` at each of :data:`MEMORY_CONCURRENCY`,
    against a receiver of its own that answers every request ``memory_delay``
    seconds late (so requests pile up to the concurrency, each on its own
    connection) and ``big_response_share`` of them with a body of
    ``big_response_mb``: every message delivered once, and the peak RSS of the
    dispatcher doing it."""
    s = bench.settings
    replies = Replies(s.memory_delay, s.big_response_share, round(s.big_response_mb * MB))
    runs: list[DrainRun] = []
    for concurrency in MEMORY_CONCURRENCY:
        bench.progress(
            f"memory: {s.memory_messages:,} messages at concurrency {concurrency:,}, "
            f"{s.big_response_share:g} of the responses {s.big_response_mb:g} MB long"
        )
        # a receiver per drain: its connection counts are this drain's
        with ReceiverProcess(replies=replies) as receiver:
            run = drain_once(
                bench,
                design="outbox",
                http=True,
                messages=s.memory_messages,
                receiver=receiver,
                concurrency=concurrency,
            )
            counts = receiver.counts()
        runs.append(
            dataclasses.replace(
                run,
                receiver_connections=counts["connections"],
                most_open_connections=counts["most_open_connections"],
                big_mb_sent=counts["big_bytes_sent"] / MB,
            )
        )
    failures = [f"concurrency {r.concurrency}: {f}" for r in runs for f in r.failures]
    return MemoryResult(
        messages=s.memory_messages,
        big_response_share=s.big_response_share,
        big_response_mb=s.big_response_mb,
        delay_s=s.memory_delay,
        runs=runs,
        ok=not failures,
        failures=failures,
    )
