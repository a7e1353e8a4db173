"""The benchmarks' fast HTTP receiver (it lives in ``dispatchers/bench/receiver.py``).

Run it by hand with ``python benchmarks/receiver.py --port 8080``.
"""

from __future__ import annotations

import sys

from dispatchers.bench.receiver import main

if __name__ == "__main__":
    sys.exit(main())
