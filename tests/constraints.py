"""The pinned development environment: ``tests/constraints.txt``, and its refresh.

The library's own requirements are ranges (``pyproject.toml``): an application
installs it among its own dependencies. The environment the suite runs in is
pinned instead, so that a new release of any dependency cannot break the test
command overnight: the README's install and ``.ci/run`` both read

    pip install -e '.[dev]' -c tests/constraints.txt

``python -m tests.constraints refresh`` makes a virtual environment of the newest
releases the ranges allow (``.venv-newest/``, installed with no constraints), lists
what changed against the pins, runs the suite in it, and writes the new pins only
if the suite passes; otherwise it says what broke and leaves the pins as they are.
``--no-test`` writes them without running the suite; arguments after ``--`` go to
pytest (a part of the suite, ``-x``, ...).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "tests" / "constraints.txt"
NEWEST = ROOT / ".venv-newest"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(text: str) -> dict[str, str]:
    """The ``name==version`` lines of a constraints file, by normalised name."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            found[normalise(match.group(1))] = match.group(2)
    return found


def normalise(name: str) -> str:
    """A distribution's name as the package index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """One line per distribution added, removed or moved to another version."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        lines.append(f"  {name}: {before or '(new)'} -> {after or '(gone)'}")
    return lines


def header() -> str:
    today = datetime.date.today().isoformat()
    return (
        "# The development and CI environment, pinned (the library's own requirements\n"
        "# stay ranges): pip install -e '.[dev]' -c tests/constraints.txt\n"
        "# Refresh with: python -m tests.constraints refresh (see tests/constraints.py)\n"
        f"# Made on {today} with Python {platform.python_version()} on {sys.platform}.\n"
    )


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, text=True, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


def refresh(*, test: bool, pytest_args: list[str]) -> int:
    """Install the newest releases in :data:`NEWEST`; test; write the pins if green."""
    shutil.rmtree(NEWEST, ignore_errors=True)
    python = NEWEST / "bin" / "python"
    for step in (
        [sys.executable, "-m", "venv", str(NEWEST)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "-e", f"{ROOT}[dev]"],
    ):
        if run(step).returncode != 0:
            print("refresh: the install failed; the pins are unchanged", file=sys.stderr)
            return 1
    frozen = run(
        [str(python), "-m", "pip", "freeze", "--exclude-editable"], capture_output=True
    ).stdout
    old = pins(CONSTRAINTS.read_text(encoding="utf-8")) if CONSTRAINTS.exists() else {}
    new = pins(frozen)
    moved = changes(old, new)
    print("changed against tests/constraints.txt:" if moved else "no release changed")
    print("\n".join(moved))
    if test:
        suite = run([str(NEWEST / "bin" / "pytest"), *pytest_args], cwd=ROOT)
        if suite.returncode != 0:
            print(
                "refresh: the suite fails on the newest releases (its summary above says "
                "what broke); tests/constraints.txt is unchanged",
                file=sys.stderr,
            )
            return 1
    lines = [f"{name}=={version}" for name, version in sorted(new.items())]
    CONSTRAINTS.write_text(header() + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)} ({len(lines)} pins)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.constraints", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("refresh", help="re-pin to the newest releases, if they pass")
    made.add_argument("--no-test", action="store_true", help="write the pins untested")
    made.add_argument("pytest_args", nargs="*", help="after --: arguments to pytest")
    args = parser.parse_args(argv)
    return refresh(test=not args.no_test, pytest_args=args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
