"""A drain on each stock server keeps pace with the same drain on the embedded one.

What a plan that is cheap on one build and costs seconds on another looks like
from outside: on Debian's PostgreSQL 15 with JIT on, every claim was compiled and
a drain ran at 13-30 messages a second, where the embedded server ran thousands.
So each stock server drains ``MESSAGES`` messages over HTTP (``outbox bench
--scenario drain-http``, a real dispatcher and receiver) in turn with the
embedded server, twice each, and its better run must reach 75% of the embedded
server's better run. Alternating runs share whatever else the machine is doing.
The figures themselves are the bench's to report (README, "Performance").
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PgServer, ServerPool

pytestmark = pytest.mark.every_server

MESSAGES = 4000
ROUNDS = 2
SHARE = 0.75
_counter = itertools.count()


def drain_rate(server: PgServer) -> float:
    """Messages a second of one bench drain on ``server``, in a database of its own."""
    name = f"outbox_pace_{os.getpid()}_{next(_counter)}"
    url = server.create_database(name)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dispatchers.cli",
                "bench",
                "--database-url",
                url,
                "--scenario",
                "drain-http",
                "-n",
                str(MESSAGES),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        server.drop_database(name)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)["scenarios"]["drain-http"]
    assert (result["delivered"], result["duplicates"]) == (MESSAGES, 0), result
    return float(result["msgs_per_s"])


def test_a_drain_keeps_pace_with_the_embedded_server(
    pg_server: PgServer, server_pool: ServerPool
) -> None:
    if pg_server.embedded is not None:
        pytest.skip("the embedded server is the one the others are held to")
    embedded = server_pool.get("embedded")
    rates: dict[str, list[float]] = {"embedded": [], pg_server.name: []}
    for _ in range(ROUNDS):
        rates["embedded"].append(drain_rate(embedded))
        rates[pg_server.name].append(drain_rate(pg_server))
    assert max(rates[pg_server.name]) >= SHARE * max(rates["embedded"]), rates
