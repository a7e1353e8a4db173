"""The long mode: many seeds, one table.

``python -m tests.history --seeds 200`` runs seeds 1 to 200 (``--first`` moves the
start; ``--seed N`` runs that one seed, repeatable), ``--minutes 30`` stops
starting new seeds after 30 minutes; ``--short`` plays the CI plan instead of
each seed's own. Each seed runs on a fresh database of an embedded PostgreSQL
started for the run in a temporary directory, which the plan's database restart
stops and starts; ``--database-url`` names a server of your own instead (a
superuser's URL: each seed creates and drops a database there, and the restart
is skipped). One line per seed as it ends, every violation with its evidence,
then the table of invariants by faults (a violation that matches a known
defect's context is counted apart, as ``+k``). Exit 1 when any invariant broke
or a seed failed to run. ``--recheck DIR/history.json`` checks a kept history
again.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from dispatchers.embedded import EmbeddedPostgres
from tests.conftest import PgServer, _throwaway
from tests.history.checks import check
from tests.history.report import Outcome, outcome, table
from tests.history.run import run
from tests.history.store import dump, load


@contextlib.contextmanager
def server(url: str | None, workdir: Path) -> Iterator[tuple[PgServer, bool]]:
    """The server the seeds run on, and whether the run may restart it."""
    if url:
        yield PgServer.connect(url, "external"), False
        return
    embedded = EmbeddedPostgres(workdir / "pg", delete=True)
    try:
        _throwaway(embedded.url)
        yield PgServer.connect(embedded.url, "embedded", embedded=embedded), True
    finally:
        embedded.cleanup()


def one(
    seed: int,
    pg: PgServer,
    restartable: bool,
    workdir: Path,
    *,
    short: bool,
    verbose: bool,
    keep: bool = False,
) -> Outcome:
    name = f"history_{seed}_{os.getpid()}"
    started = time.monotonic()
    directory = workdir / f"seed-{seed}"
    again = 1
    while directory.exists():  # the same seed run again
        again += 1
        directory = workdir / f"seed-{seed}-{again}"
    directory.mkdir()
    try:
        url = pg.create_database(name, template=pg.template)
        history = run(
            seed,
            url,
            directory,
            server=pg if restartable else None,
            short=short,
            progress=(lambda line: print(f"  {line}", flush=True)) if verbose else (lambda _: None),
        )
        violations = check(history)
        dump(history, directory / "history.json")
    except Exception as exc:
        return Outcome(
            seed,
            seconds=time.monotonic() - started,
            error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
        )
    finally:
        with contextlib.suppress(Exception):
            pg.drop_database(name)
    result = outcome(history, violations, time.monotonic() - started)
    if not result.violations and not result.notes and not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.history", description=__doc__)
    parser.add_argument(
        "--seeds", type=int, help="how many seeds (default: 10, or unbounded with --minutes)"
    )
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--seed", type=int, action="append", help="run this seed (repeatable)")
    parser.add_argument("--minutes", type=float, help="start no seed after this long")
    parser.add_argument("--short", action="store_true", help="the CI plan of each seed")
    parser.add_argument("--database-url", help="a server of your own (no restart)")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep every seed's logs")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each step")
    parser.add_argument(
        "--recheck",
        type=Path,
        metavar="HISTORY_JSON",
        help="run the checks again on a history a run kept, and exit",
    )
    args = parser.parse_args(argv)
    if args.recheck:
        history = load(args.recheck)
        violations = check(history)
        for v in violations:
            print(v.describe(history.seed))
        print(outcome(history, violations, 0.0).line())
        return 1 if violations else 0
    if args.seed:
        seeds: Iterator[int] = iter(args.seed)
    elif args.seeds is None and args.minutes:
        seeds = itertools.count(args.first)
    else:
        seeds = iter(range(args.first, args.first + (args.seeds or 10)))
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outbox-history-"))
    workdir.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    with server(args.database_url, workdir) as (pg, restartable):
        pg.template_url()  # the migrated template every seed's database is cloned from
        for seed in seeds:
            if deadline is not None and time.monotonic() > deadline:
                break
            result = one(
                seed,
                pg,
                restartable,
                workdir,
                short=args.short,
                verbose=args.verbose,
                keep=args.keep,
            )
            outcomes.append(result)
            print(result.line(), flush=True)
            for v in result.violations:
                print(v.describe(seed), flush=True)
            for note in result.notes:
                print(f"  note: {note}", flush=True)
            if result.error:
                print(result.error, flush=True)
    print()
    print(table(outcomes))
    print(f"\nlogs of seeds with violations or notes: {workdir}")
    return 1 if any(o.violations or o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
