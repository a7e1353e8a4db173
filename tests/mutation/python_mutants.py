"""mutmut over the pure decision modules, each against the unit tests that cover it.

``python -m tests.mutation.python_mutants [MODULE ...]`` (``--list`` names them)
copies ``outbox``, ``dispatchers``, ``sql``, ``tests`` and ``pyproject.toml`` into a
temporary directory per module, runs ``mutmut run`` there with that module alone
to mutate and its unit tests alone to run, and prints the module's score and
each surviving mutant as a diff. The working tree is never written: mutmut's
``mutants/`` directory lives in the copy, removed afterwards unless ``--keep``
(then ``mutmut show NAME`` and ``mutmut browse`` work inside it).

A surviving mutant is a change of the code that no test notices: kill it with a
test that pins the behaviour down, or, when the change cannot alter behaviour
(an equivalent mutant), name it in :data:`EQUIVALENT` with the reason.
Exits 1 when a mutant survives that is not listed there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.mutation import fresh_caches

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
    "outcome": Module("dispatchers/delivery/outcome.py", ("tests/delivery/test_outcome.py",)),
    "retry": Module(
        "dispatchers/delivery/retry.py",
        ("tests/delivery/test_retry.py", "tests/delivery/test_retry_schedule_policy.py"),
    ),
    "health": Module("dispatchers/delivery/health.py", ("tests/delivery/test_health_book.py",)),
    "cadence": Module("dispatchers/runtime/cadence.py", ("tests/runtime/test_cadence.py",)),
    "policy_text": Module(
        "dispatchers/ui/policy_text.py",
        ("tests/unit/test_policy_text.py", "tests/delivery/test_retry_schedule_policy.py"),
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

EXHAUSTIVE_MATCH = "the case _ of a match exhaustive over Verdict"

EQUIVALENT: dict[str, str] = {
    "dispatchers.delivery.outcome.x_classify_response__mutmut_18": (
        "a missing Outbox-Abort header read as 'XXXX' instead of '': neither is 'true'"
    ),
    "dispatchers.delivery.outcome.x_classify_response__mutmut_95": (
        "100 <= status < 599: 599 is a 5xx, retried before this test is reached"
    ),
    "dispatchers.delivery.outcome.x_decide__mutmut_6": EXHAUSTIVE_MATCH,
    "dispatchers.delivery.outcome.x_decide__mutmut_69": EXHAUSTIVE_MATCH,
    "dispatchers.delivery.outcome.x__header__mutmut_1": (
        "without the exact-name lookup, the scan by lower-cased name finds the same value in "
        "every mapping the clients give (httpx lower-cases names; aiohttp's CIMultiDict "
        "yields its first value either way): the lookup is a fast path"
    ),
    "dispatchers.delivery.retry.x_bounded_delay__mutmut_7": (
        "delay >= 0 instead of > 0: a delay of 0 (or -0.0, equal to it) is 0 either way"
    ),
    "dispatchers.delivery.health.x_is_failure__mutmut_1": (
        "'and' for 'or': a delivered (2xx) or gone (410) outcome is no failure by its status either"
    ),
    "dispatchers.runtime.cadence.xǁCadenceǁclaimed__mutmut_2": (
        "the first claim decays the starting rate of 0: exp(-inf) * 0 is 0 too"
    ),
    "dispatchers.ui.policy_text.x_format_duration__mutmut_10": (
        "/ for //: the branch is taken only when the unit divides the span exactly"
    ),
    "outbox._digest.x__field__mutmut_5": (
        "to_bytes(8) is big-endian by default from Python 3.11, the oldest supported"
    ),
    "outbox._digest.x_request_digest__mutmut_14": (
        "to_bytes(8) is big-endian by default from Python 3.11, the oldest supported"
    ),
    "outbox._storable.x_text_problem__mutmut_11": "'UTF-8' names the same codec as 'utf-8'",
    "outbox._message.x_encode_body__mutmut_17": "'UTF-8' names the same codec as 'utf-8'",
    "outbox._message.x_encode_body__mutmut_33": "'UTF-8' names the same codec as 'utf-8'",
    "outbox._message.xǁNewMessageǁparams__mutmut_16": (
        "no headers encoded as JSON instead of written as '{}': the encoding is '{}'"
    ),
    "outbox._message.x_check_key__mutmut_29": (
        "strip() for strip(' '): a key is printable ASCII, whose only whitespace is the space"
    ),
    "outbox._storable.x_check_json__mutmut_6": (
        "paths=None in the first walk: as falsy as False (paths change only the text)"
    ),
    "outbox._storable.x_check_json__mutmut_12": (
        "paths=True in the first walk, which only decides whether there is a problem: "
        "the paths change its text, not whether it is found"
    ),
    **dict.fromkeys(
        (f"outbox._storable.x_check_json__mutmut_{n}" for n in (31, 32, 33)),
        "the fallback text is never used: the second walk is the first again, with paths, "
        "and finds the same problem",
    ),
    "outbox._storable.x__problem__mutmut_7": (
        "one more level: a container at the deepest level allowed returns, and nothing "
        "else has children, so the walk ends before it"
    ),
    "outbox._storable.x__problem__mutmut_26": (
        "paths made in the first walk too: only the text of a problem changes"
    ),
    "outbox._storable.x__problem__mutmut_28": (
        "another empty path in the first walk: only the text of a problem changes"
    ),
    "outbox._storable.x__problem__mutmut_34": (
        "return for break after the last level: both end the walk with None"
    ),
    "outbox._storable.x__shown__mutmut_2": (
        "repr for str of an int key, str for repr of a bool key: the same text for both"
    ),
}
"""Mutants that change no behaviour, by mutmut's name, with the reason. mutmut
numbers the mutants of a function in the order it makes them, so a change to
the function renumbers them: check this list against ``--keep`` and ``mutmut
show`` after such a change."""

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
    """Run mutmut over one module; its counts by status, and its survivors' diffs."""
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
        counts: Counter[str] = Counter()
        survivors: list[str] = []
        for line in results.splitlines():
            match = _RESULT.match(line)
            if match is None:
                continue
            mutant, status = match[1], match[2].strip()
            counts[status] += 1
            if not _NOTICED.get(status, False) and mutant not in EQUIVALENT:
                shown = subprocess.run(
                    [_mutmut(), "show", mutant],
                    cwd=work, env=env, capture_output=True, text=True, check=False,
                ).stdout  # fmt: skip
                diff = [
                    d for d in shown.splitlines()
                    if d[:1] in "+-" and not d.startswith(("+++", "---"))
                ]  # fmt: skip
                survivors.append(f"{mutant} ({status})\n" + "\n".join(f"    {d}" for d in diff))
        return counts, survivors
    finally:
        if keep:
            print(f"{name}: kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def score(counts: Counter[str]) -> str:
    total = sum(counts.values())
    noticed = sum(n for status, n in counts.items() if _NOTICED.get(status, False))
    percent = 100.0 * noticed / total if total else 100.0
    rest = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if not _NOTICED.get(s, False))
    return f"{noticed}/{total} killed ({percent:.1f}%)" + (f"; {rest}" if rest else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation.python_mutants", description=__doc__.splitlines()[0]
    )
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="default: every one")
    parser.add_argument("--list", action="store_true", help="name the modules and their tests")
    parser.add_argument("--keep", action="store_true", help="keep each module's scratch copy")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    if args.list:
        for name, module in MODULES.items():
            print(f"{name:14} {module.source:28} {' '.join(module.tests)}")
        return 0
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; --list names them")
    failed = False
    for name in args.modules or list(MODULES):
        counts, survivors = run_module(name, max_children=args.max_children, keep=args.keep)
        print(f"{name:14} {score(counts)}", flush=True)
        for survivor in survivors:
            print(f"  survived: {survivor}", flush=True)
        failed = failed or bool(survivors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
