"""Enqueue cost: ``outbox bench --scenario enqueue`` (and its options).

Times ``Outbox.enqueue`` inside an open transaction with and without NOTIFY, and
compares the commit throughput of business transactions with one outbox row each
against the same transactions without it. A thin script kept for habit; the
benchmark lives in ``dispatchers.bench``. Extra arguments go to ``outbox bench``:

    python benchmarks/enqueue_latency.py
    python benchmarks/enqueue_latency.py --enqueue-count 20000 --enqueue-batch 1000
    python benchmarks/enqueue_latency.py --database-url postgresql://localhost/app --json
"""

from __future__ import annotations

import sys

from dispatchers.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--scenario", "enqueue", *sys.argv[1:]]))
