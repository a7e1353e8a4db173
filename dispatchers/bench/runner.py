"""Runs the chosen scenarios and prints one table (or one JSON object).

Every figure is shown beside its target where it has one
(:mod:`dispatchers.bench.report`); a missed target is reported, never hidden, but
only a correctness failure (a message lost, left behind or delivered twice) makes
the exit status 1. The table and the JSON come from the same results.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from dispatchers.bench import Settings
from dispatchers.bench.context import Bench
from dispatchers.bench.env import connect, database
from dispatchers.bench.report import table_rows
from dispatchers.bench.results import Result, ScenarioFailed, to_json
from dispatchers.bench.scenarios import SCENARIOS
from dispatchers.bench.table import Row, format_table
from dispatchers.runtime import loop as loops
from outbox.dsn import redact


@dataclass(frozen=True)
class Machine:
    """Where the figures were measured."""

    cpus: int | None
    platform: str
    python: str
    postgres: str | None
    #: "on" (the server JIT-compiles costly statements; the dispatcher turns it off
    #: for its own), "off" (set off on the server) or "unavailable" (a build without it)
    postgres_jit: str | None
    psycopg: str | None
    httpx: str | None
    httpcore: str | None
    event_loop: str
    uvloop: str | None
    load_average_before: tuple[float, float, float] | None
    load_average_after: tuple[float, float, float] | None


@dataclass(frozen=True)
class Report:
    """One run of ``outbox bench``: :meth:`to_json` is what ``--json`` prints."""

    machine: Machine
    database: str
    postgres_cpu_measured: bool
    settings: Settings
    scenarios: dict[str, Result]
    table: list[Row]
    ok: bool

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = to_json(self)
        return data


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _load_average() -> tuple[float, float, float] | None:
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def run(
    settings: Settings,
    *,
    scenarios: list[str],
    database_url: str | None,
    progress: Callable[[str], None],
) -> Report:
    """Run ``scenarios`` in order and return the report."""
    results: dict[str, Result] = {}
    event_loop = loops.resolve(settings.event_loop)  # uvloop asked for but missing: fail now
    load_before = _load_average()
    with database(database_url) as db:
        with connect(db.url, autocommit=True) as conn:
            server_version = conn.info.parameter_status("server_version")
            jit = conn.execute(
                "SELECT CASE WHEN NOT pg_jit_available() THEN 'unavailable'"
                " ELSE current_setting('jit') END"
            ).fetchone()
        bench = Bench(db, settings, progress)
        try:
            for name in scenarios:
                try:
                    results[name] = SCENARIOS[name](bench)
                except Exception as exc:  # report it and go on with the next scenario
                    progress(f"{name}: failed: {type(exc).__name__}: {exc}")
                    results[name] = ScenarioFailed(
                        ok=False, failures=[f"{type(exc).__name__}: {exc}"]
                    )
        finally:
            bench.close()
        postgres_cpu_measured = bench.pg_clock is not None
    machine = Machine(
        cpus=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        postgres=server_version,
        postgres_jit=jit[0] if jit else None,
        psycopg=_version("psycopg"),
        httpx=_version("httpx"),
        httpcore=_version("httpcore"),
        event_loop=event_loop,
        uvloop=_version("uvloop") if event_loop == "uvloop" else None,
        load_average_before=load_before,
        load_average_after=_load_average(),
    )
    return Report(
        machine=machine,
        database="embedded (throwaway)" if db.embedded else redact(db.url),
        postgres_cpu_measured=postgres_cpu_measured,
        settings=settings,
        scenarios=results,
        table=table_rows(results),
        ok=all(r.ok for r in results.values()),
    )


def main(
    settings: Settings, *, scenarios: list[str], database_url: str | None, json_output: bool
) -> bool:
    """``outbox bench``: run, print, and say whether every scenario delivered each
    message once (a missed performance target does not fail the run)."""

    def progress(text: str) -> None:
        print(f"outbox bench: {text}", file=sys.stderr, flush=True)

    report = run(settings, scenarios=scenarios, database_url=database_url, progress=progress)
    if json_output:
        print(json.dumps(report.to_json(), indent=2))
    else:
        m = report.machine
        load = m.load_average_before
        print(
            f"outbox bench: {m.cpus} CPUs, {m.platform}, Python {m.python}, "
            f"PostgreSQL {m.postgres} ({report.database}, JIT {m.postgres_jit}), "
            f"psycopg {m.psycopg}, "
            f"httpx {m.httpx}, event loop {m.event_loop}"
            + (f" {m.uvloop}" if m.uvloop else "")
            + (f", load average {load[0]:.1f} at start" if load else "")
        )
        print(format_table(report.table))
        for name, result in report.scenarios.items():
            for failure in result.failures:
                print(f"FAILED {name}: {failure}")
    return report.ok
