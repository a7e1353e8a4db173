"""Every install line names this project's distribution and one of its extras.

The distribution is ``pg-outbox`` (the name ``outbox`` on the package index is an
unrelated project's); its import packages and command are ``outbox``. Pure: reads
the checkout's files.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dispatchers.cli._common import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
INSTALL = re.compile(r"pip install (?:--?[\w-]+ )*'?([A-Za-z][\w.-]*)(?:\[([\w,]+)\])?")


def sources() -> list[Path]:
    found = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for package in ("outbox", "dispatchers", "examples"):
        found += [p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".md", ".service")]
    found += [ROOT / "examples" / "deploy" / "Containerfile"]
    return found


def test_the_distribution_is_named_once() -> None:
    assert PROJECT["name"] == DISTRIBUTION == "pg-outbox"


def test_every_install_line_names_the_distribution_and_an_extra_it_has() -> None:
    extras = set(PROJECT["optional-dependencies"])
    seen = 0
    for path in sources():
        text = path.read_text(encoding="utf-8")
        for match in INSTALL.finditer(text):
            name, listed = match.group(1), match.group(2)
            where = f"{path.relative_to(ROOT)}: {match.group(0)!r}"
            if name in (".", "-e"):
                continue
            assert name == DISTRIBUTION, where
            assert set((listed or "").split(",")) - {""} <= extras, where
            seen += 1
    assert seen >= 20  # the table of extras (docs/how-to/install.md) alone has a dozen
