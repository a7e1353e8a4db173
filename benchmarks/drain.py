"""Drain throughput: ``outbox bench --scenario drain-http`` (and its options).

A thin script kept for habit; the benchmark itself lives in ``dispatchers.bench``
so that ``outbox bench`` works from an installed wheel. Extra arguments go to
``outbox bench``:

    python benchmarks/drain.py                              # embedded server
    python benchmarks/drain.py -n 50000 --concurrency 128 --repeat 3
    python benchmarks/drain.py --baseline naive             # A B A B A B with the naive design
    python benchmarks/drain.py --scenario drain-noop        # both drains
"""

from __future__ import annotations

import sys

from dispatchers.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--scenario", "drain-http", *sys.argv[1:]]))
