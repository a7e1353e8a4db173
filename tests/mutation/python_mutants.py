"""mutmut over the pure decision modules, each against the unit tests that cover it.

``python -m tests.mutation.python_mutants [MODULE ...]`` (``--list`` names them)
copies ``outbox``, ``dispatchers``, ``sql``, ``tests`` and ``pyproject.toml`` into a
temporary directory per module, runs ``mutmut run`` there with that module alone
to mutate and its unit tests alone to run, and prints the module's score and
each surviving mutant with its change (the lines taken out and put in, as
:data:`EQUIVALENT` names it). The working tree is never written: mutmut's
``mutants/`` directory lives in the copy, removed afterwards unless ``--keep``
(then ``mutmut show NAME`` and ``mutmut browse`` work inside it).

A surviving mutant is a change of the code that no test notices: kill it with a
test that pins the behaviour down, or, when the change cannot alter behaviour
(an equivalent mutant), name it in :data:`EQUIVALENT` with the reason. A
mutant is named there by its change (:func:`change_key`: the function and the
lines changed), which stays the same when mutmut numbers the function's
mutants anew. Exits 1 when a mutant survives that is not listed there.
``--check`` runs no test: it fails when an entry of :data:`EQUIVALENT` is the
change of no mutant mutmut makes of the code as it is now, or a module or test
file named here does not exist. Each module's score is written into the table of
``docs/contributing/testing.md`` (:mod:`tests.mutation.scores`; ``--no-record``:
not, as CI runs it).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.mutation import fresh_caches, scores

ROOT = Path(__file__).resolve().parents[2]
FRESH = "tests.mutation.fresh_caches"
COPIED = ("outbox", "dispatchers", "sql", "tests", "pyproject.toml")
IGNORED = shutil.ignore_patterns(
    "__pycache__", "*.pyc", ".hypothesis", ".pytest_cache", ".mypy_cache", "mutants"
)


@dataclass(frozen=True)
class Module:
    source: str
    tests: tuple[str, ...]


MODULES: dict[str, Module] = {
    "outcome": Module(
        "dispatchers/delivery/outcome.py",
        ("tests/delivery/test_outcome.py", "tests/delivery/test_outcome_unknown_verdict.py"),
    ),
    "retry": Module(
        "dispatchers/delivery/retry.py",
        ("tests/delivery/test_retry.py", "tests/delivery/test_retry_schedule_policy.py"),
    ),
    "health": Module("dispatchers/delivery/health.py", ("tests/delivery/test_health_book.py",)),
    "cadence": Module("dispatchers/runtime/cadence.py", ("tests/runtime/test_cadence.py",)),
    "policy_text": Module(
        "dispatchers/ui/policy_text.py",
        (
            "tests/unit/test_policy_text.py",
            "tests/unit/test_credential_fields.py",
            "tests/delivery/test_retry_schedule_policy.py",
        ),
    ),
    "policy_fields": Module("outbox/_policy_fields.py", ("tests/unit/test_policy_fields.py",)),
    "digest": Module("outbox/_digest.py", ("tests/unit/test_request_digest.py",)),
    "storable": Module(
        "outbox/_storable.py",
        (
            "tests/unit/test_storable.py",
            "tests/unit/test_message_validation.py",
            "tests/unit/test_endpoints_validation.py",
        ),
    ),
    "message": Module("outbox/_message.py", ("tests/unit/test_message_validation.py",)),
}


def _key(function: str, *lines: str) -> str:
    """The name of a mutant of ``function`` (mutmut's name without the number) that
    changes ``lines`` (``-`` a line taken out, ``+`` one put in, each stripped)."""
    return f"{function}: {' | '.join(lines)}"


EQUIVALENT: dict[str, str] = {
    _key(
        "dispatchers.delivery.outcome.x_classify_response",
        '-if (_header(headers, ABORT_HEADER) or "").strip().lower() == "true":',
        '+if (_header(headers, ABORT_HEADER) or "XXXX").strip().lower() == "true":',
    ): "a missing Outbox-Abort header read as 'XXXX' instead of '': neither is 'true'",
    _key(
        "dispatchers.delivery.outcome.x_classify_response",
        "-if 100 <= status <= 599:",
        "+if 100 <= status < 599:",
    ): "100 <= status < 599: 599 is a 5xx, retried before this test is reached",
    _key(
        "dispatchers.delivery.outcome.x__header",
        "-value = headers.get(name)",
        "+value = None",
    ): (
        "without the exact-name lookup, the scan by lower-cased name finds the same value in"
        " every mapping the clients give (httpx lower-cases names; aiohttp's CIMultiDict yields"
        " its first value either way): the lookup is a fast path"
    ),
    _key(
        "dispatchers.delivery.retry.x_bounded_delay",
        "-return min(delay, MAX_DELAY) if delay > 0 else 0.0",
        "+return min(delay, MAX_DELAY) if delay >= 0 else 0.0",
    ): "delay >= 0 instead of > 0: a delay of 0 (or -0.0, equal to it) is 0 either way",
    _key(
        "dispatchers.delivery.health.x_is_failure",
        "-if outcome.verdict is Verdict.DELIVERED or outcome.verdict is Verdict.GONE:",
        "+if outcome.verdict is Verdict.DELIVERED and outcome.verdict is Verdict.GONE:",
    ): (
        "'and' for 'or': a delivered (2xx) or gone (410) outcome is no failure by its status either"
    ),
    _key(
        "dispatchers.runtime.cadence.xǁCadenceǁclaimed",
        "-if self.last_claim > -math.inf:",
        "+if self.last_claim >= -math.inf:",
    ): "the first claim decays the starting rate of 0: exp(-inf) * 0 is 0 too",
    _key(
        "dispatchers.ui.policy_text.x_format_duration",
        '-return f"{int(seconds // size)}{unit}"',
        '+return f"{int(seconds / size)}{unit}"',
    ): "/ for //: the branch is taken only when the unit divides the span exactly",
    _key(
        "outbox._digest.x__field",
        '-return len(data).to_bytes(8, "big") + data',
        "+return len(data).to_bytes(8, ) + data",
    ): "to_bytes(8) is big-endian by default from Python 3.11, the oldest supported",
    _key(
        "outbox._digest.x_request_digest",
        '-digest.update(len(named).to_bytes(8, "big"))',
        "+digest.update(len(named).to_bytes(8, ))",
    ): "to_bytes(8) is big-endian by default from Python 3.11, the oldest supported",
    _key(
        "outbox._storable.x_text_problem",
        '-value.encode("utf-8")',
        '+value.encode("UTF-8")',
    ): "'UTF-8' names the same codec as 'utf-8'",
    _key(
        "outbox._message.x_encode_body",
        '-data = _BODY_JSON.encode(json).encode("utf-8")',
        '+data = _BODY_JSON.encode(json).encode("UTF-8")',
    ): "'UTF-8' names the same codec as 'utf-8'",
    _key(
        "outbox._message.x_encode_body",
        '-data = body.encode("utf-8")',
        '+data = body.encode("UTF-8")',
    ): "'UTF-8' names the same codec as 'utf-8'",
    _key(
        "outbox._message.xǁNewMessageǁparams",
        '-"headers": _HEADERS_JSON.encode(self.headers) if self.headers else "{}",',
        '+"headers": _HEADERS_JSON.encode(self.headers) if (self.headers) or True else "{}",',
    ): "no headers encoded as JSON instead of written as '{}': the encoding is '{}'",
    _key(
        "outbox._message.x_check_key",
        '-if value != value.strip(" "):',
        "+if value != value.strip(None):",
    ): "strip() for strip(' '): a key is printable ASCII, whose only whitespace is the space",
    _key(
        "outbox._storable.x_check_json",
        "-if _problem(value, text, max_depth, max_values, paths=False) is None:",
        "+if _problem(value, text, max_depth, max_values, paths=None) is None:",
    ): "paths=None in the first walk: as falsy as False (paths change only the text)",
    _key(
        "outbox._storable.x_check_json",
        "-if _problem(value, text, max_depth, max_values, paths=False) is None:",
        "+if _problem(value, text, max_depth, max_values, paths=True) is None:",
    ): (
        "paths=True in the first walk, which only decides whether there is a problem: the paths"
        " change its text, not whether it is found"
    ),
    _key(
        "outbox._storable.x_check_json",
        '-raise error(field, problem or "is not JSON PostgreSQL can store")',
        '+raise error(field, problem or "XXis not JSON PostgreSQL can storeXX")',
    ): (
        "the fallback text is never used: the second walk is the first again, with paths, and"
        " finds the same problem"
    ),
    _key(
        "outbox._storable.x_check_json",
        '-raise error(field, problem or "is not JSON PostgreSQL can store")',
        '+raise error(field, problem or "is not json postgresql can store")',
    ): (
        "the fallback text is never used: the second walk is the first again, with paths, and"
        " finds the same problem"
    ),
    _key(
        "outbox._storable.x_check_json",
        '-raise error(field, problem or "is not JSON PostgreSQL can store")',
        '+raise error(field, problem or "IS NOT JSON POSTGRESQL CAN STORE")',
    ): (
        "the fallback text is never used: the second walk is the first again, with paths, and"
        " finds the same problem"
    ),
    _key(
        "outbox._storable.x__problem",
        "-for depth in range(max_depth + 1):",
        "+for depth in range(max_depth + 2):",
    ): (
        "one more level: a container at the deepest level allowed returns, and nothing else has"
        " children, so the walk ends before it"
    ),
    _key(
        "outbox._storable.x__problem",
        '-step = f"{path}[{_shown(key)}]" if paths else ""',
        '+step = f"{path}[{_shown(key)}]" if (paths) or True else ""',
    ): "paths made in the first walk too: only the text of a problem changes",
    _key(
        "outbox._storable.x__problem",
        '-step = f"{path}[{_shown(key)}]" if paths else ""',
        '+step = f"{path}[{_shown(key)}]" if paths else "XXXX"',
    ): "another empty path in the first walk: only the text of a problem changes",
    _key(
        "outbox._storable.x__problem",
        "-break",
        "+return",
    ): "return for break after the last level: both end the walk with None",
    _key(
        "outbox._storable.x__shown",
        "-if isinstance(key, int) and not isinstance(key, bool):",
        "+if isinstance(key, int) and isinstance(key, bool):",
    ): "repr for str of an int key, str for repr of a bool key: the same text for both",
}
"""Mutants that change no behaviour, each named by its change (:func:`_key`),
with the reason. A survivor is listed with its name here; ``--check`` (and
``tests/unit/test_mutation_runners.py``) fails when an entry names no mutant of
the code as it is, so an entry goes when the line it excuses changes."""


def change_key(mutant: str, diff: Sequence[str]) -> str:
    """How :data:`EQUIVALENT` names a mutant: its function (mutmut's name without
    the number) and the lines it changes, each stripped and its runs of spaces
    made one, ``-`` for a line taken out, ``+`` for one put in, joined by `` | ``."""
    changed = [
        line[0] + " ".join(line[1:].split())
        for line in diff
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return _key(mutant.rpartition("__mutmut_")[0], *changed)


def mutants_of(name: str, tree: Path = ROOT) -> dict[str, str]:
    """The mutants mutmut makes of module ``name`` as it is in ``tree`` (none is
    run), by mutmut's name, each with its :func:`change_key`."""
    return dict(_mutants_of(name, (tree / MODULES[name].source).read_text("utf-8")))


@functools.cache
def _mutants_of(name: str, text: str) -> tuple[tuple[str, str], ...]:
    from mutmut import configuration
    from mutmut.mutation.file_mutation import mutate_file_contents

    module = MODULES[name]
    dotted = module.source.removesuffix(".py").replace("/", ".")
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="outbox-mutmut-config-") as config:
        # mutmut reads its configuration (what not to mutate) from the directory it runs in
        (Path(config) / "setup.cfg").write_text(_setup_cfg(module))
        os.chdir(config)
        configuration.reset_config()
        try:
            mutated = mutate_file_contents(module.source, text)
        finally:
            os.chdir(here)
            configuration.reset_config()
    lines = mutated.code.splitlines()
    spans = mutated.line_span_by_function_name

    def lines_of(function: str) -> list[str]:
        span = spans[function]
        return lines[span.start - 1 : span.end]

    keys = []
    for mutant in mutated.mutant_names:
        original = mutant.rpartition("__mutmut_")[0] + "__mutmut_orig"
        diff = difflib.unified_diff(
            [line.replace(original, mutant) for line in lines_of(original)],
            lines_of(mutant),
            lineterm="",
        )
        keys.append((f"{dotted}.{mutant}", change_key(f"{dotted}.{mutant}", list(diff))))
    return tuple(keys)


_RESULT = re.compile(r"^\s*(\S+__mutmut_\d+): (.+)$")
#: what mutmut reports, and whether a test noticed the mutant
_NOTICED = {"killed": True, "timeout": True, "caught by type check": True, "segfault": True}


def _mutmut() -> str:
    found = Path(sys.executable).with_name("mutmut")
    if found.exists():
        return str(found)
    return shutil.which("mutmut") or sys.exit("mutmut is not installed: pip install -e '.[dev]'")


def _setup_cfg(module: Module) -> str:
    def lines(*values: str) -> str:
        return "".join(f"\n    {v}" for v in values)

    return (
        "[mutmut]\n"
        f"source_paths ={lines('outbox', 'dispatchers')}\n"
        f"only_mutate ={lines(module.source)}\n"
        f"also_copy ={lines('sql')}\n"
        f"pytest_add_cli_args ={lines('-p', 'no:cacheprovider', '-p', FRESH, '-n', '0', '-q')}\n"
        f"pytest_add_cli_args_test_selection ={lines(*module.tests)}\n"
    )


def run_module(name: str, *, max_children: int, keep: bool) -> tuple[Counter[str], list[str]]:
    """Run mutmut over one module; its counts by status (a survivor named in
    :data:`EQUIVALENT` counted as ``equivalent``), and the other survivors, each
    with its name for :data:`EQUIVALENT` and its diff."""
    module = MODULES[name]
    work = Path(tempfile.mkdtemp(prefix=f"outbox-mutmut-{name}-"))
    try:
        for part in COPIED:
            source = ROOT / part
            if source.is_dir():
                shutil.copytree(source, work / part, ignore=IGNORED)
            else:
                shutil.copy2(source, work / part)
        (work / "setup.cfg").write_text(_setup_cfg(module))
        dotted = module.source.removesuffix(".py").replace("/", ".")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", fresh_caches.ENV: dotted}
        log = work / "mutmut-run.log"
        with log.open("w") as out:
            run = subprocess.run(
                [_mutmut(), "run", "--max-children", str(max_children)],
                cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
            )  # fmt: skip
        if run.returncode != 0:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{name}: mutmut run failed ({run.returncode}):\n{tail}")
        results = subprocess.run(
            [_mutmut(), "results", "--all", "true"],
            cwd=work, env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        keys = mutants_of(name, work)
        counts: Counter[str] = Counter()
        survivors: list[str] = []
        for line in results.splitlines():
            match = _RESULT.match(line)
            if match is None:
                continue
            mutant, status = match[1], match[2].strip()
            key = keys.get(mutant, mutant)
            if _NOTICED.get(status, False):
                counts[status] += 1
            elif key in EQUIVALENT:
                counts["equivalent"] += 1
            else:
                counts[status] += 1
                survivors.append(f"{mutant} ({status}): {key}")
        return counts, survivors
    finally:
        if keep:
            print(f"{name}: kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def stale(tree: Path = ROOT) -> list[str]:
    """What no longer holds of :data:`MODULES` and :data:`EQUIVALENT` in ``tree``,
    one line each: a module or test file that does not exist, an entry of
    :data:`EQUIVALENT` that is the change of no mutant mutmut makes now."""
    problems = [
        f"{name}: no file {path}"
        for name, module in MODULES.items()
        for path in (module.source, *module.tests)
        if not (tree / path).is_file()
    ]
    if problems:
        return problems
    made: set[str] = set()
    for name in MODULES:
        made.update(mutants_of(name, tree).values())
    problems += [f"no mutant is {key!r}" for key in EQUIVALENT if key not in made]
    return problems


def score(name: str, counts: Counter[str]) -> scores.Score:
    """Module ``name``'s score from its counts by status (as :func:`run_module`
    gives them)."""
    return scores.Score(
        "python",
        name,
        mutants=sum(counts.values()),
        killed=sum(n for status, n in counts.items() if _NOTICED.get(status, False)),
        equivalent=counts["equivalent"],
        command=f"python -m tests.mutation.python_mutants {name}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation.python_mutants", description=__doc__.splitlines()[0]
    )
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="default: every one")
    parser.add_argument("--list", action="store_true", help="name the modules and their tests")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check that the files named exist and each equivalent names a mutant; run none",
    )
    parser.add_argument("--keep", action="store_true", help="keep each module's scratch copy")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--no-record",
        action="store_true",
        help=f"print the scores, do not write them into {scores.PAGE.relative_to(ROOT)}",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, module in MODULES.items():
            print(f"{name:14} {module.source:28} {' '.join(module.tests)}")
        return 0
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; --list names them")
    problems = stale()
    for problem in problems:
        print(problem)
    if args.check or problems:
        return 1 if problems else 0
    failed = False
    for name in args.modules or list(MODULES):
        start = time.monotonic()
        counts, survivors = run_module(name, max_children=args.max_children, keep=args.keep)
        result = score(name, counts)
        seconds = time.monotonic() - start
        print(f"{name:14} {result.summary()} ({seconds:.0f} s)", flush=True)
        for survivor in survivors:
            print(f"  survived: {survivor}", flush=True)
        if not args.no_record:
            scores.record(result)
        failed = failed or bool(survivors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
