"""A migration after 0033 changes a function by writing it whole
(``CREATE OR REPLACE FUNCTION``), never by editing the text the catalog holds:
no ``pg_get_functiondef`` or ``prosrc`` read, no ``replace()`` of that text run.

A function written whole reads in its migration as it runs, and shows in
``sql/schema.sql`` as that migration wrote it. 0033 is the last that edits one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "sql" / "migrations"
LAST_TEXT_EDIT = 33
"""The last migration that edits a function's text (0033, key generations)."""

_EDITS = re.compile(
    r"pg_get_functiondef|pg_get_function_sqlbody|\bprosrc\b"
    r"|EXECUTE\s+(?:regexp_)?replace\s*\(",
    re.I,
)
"""What reads a function's text from the catalog, or runs an edit of a text."""


def edits(text: str) -> list[str]:
    """The lines of a migration that read or edit a function's text (comments aside)."""
    lines = (line.split("--", 1)[0] for line in text.splitlines())
    code = "\n".join(lines)
    return [match.group(0) for match in _EDITS.finditer(code)]


def test_no_migration_after_0033_edits_a_function_as_text() -> None:
    later = {
        path.name: edits(path.read_text("utf-8"))
        for path in sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql"))
        if int(path.name[:4]) > LAST_TEXT_EDIT
    }
    assert later, "no migration after 0033 to check"
    assert {name: found for name, found in later.items() if found} == {}, (
        "write the function whole (CREATE OR REPLACE FUNCTION) instead of editing "
        "the text of pg_get_functiondef"
    )


def test_the_edit_of_0033_is_found() -> None:
    (path,) = MIGRATIONS.glob(f"{LAST_TEXT_EDIT:04d}_*.sql")
    assert edits(path.read_text("utf-8")) == ["pg_get_functiondef", "EXECUTE replace("]
