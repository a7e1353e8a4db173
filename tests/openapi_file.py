"""``docs/reference/openapi.json``: the OpenAPI document the management API serves
at ``/api/v1/openapi.json`` (every route, writing ones included), as
:func:`dispatchers.api.openapi.document` builds it from the route table.

``python -m tests.openapi_file write`` writes it (indented by two, keys in the
order the API serves them); ``check`` exits 1 with a diff when the file is not
what the code makes. ``tests/unit/test_openapi_file.py`` holds the file to the code.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dispatchers.api import routes
from dispatchers.api.openapi import document

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "docs" / "reference" / "openapi.json"
WRITE = "python -m tests.openapi_file write"


def generate() -> str:
    """The file's text: the document of the routes a server that takes changes serves."""
    return json.dumps(document(routes.served(read_only=False)), indent=2) + "\n"


def stale(committed: str, generated: str) -> str:
    """Why the file is not up to date: a unified diff, and the command that rewrites it."""
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        generated.splitlines(keepends=True),
        "docs/reference/openapi.json (committed)",
        "docs/reference/openapi.json (as the code makes it)",
    )
    return f"docs/reference/openapi.json is not the API's document; run `{WRITE}`\n" + "".join(diff)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.openapi_file", description=__doc__)
    parser.add_argument("command", choices=("write", "check"))
    command = parser.parse_args(argv).command
    text = generate()
    if command == "write":
        PATH.parent.mkdir(parents=True, exist_ok=True)
        PATH.write_text(text, "utf-8")
        print(f"{PATH.relative_to(ROOT)}: {len(text.splitlines())} lines")
        return 0
    committed = PATH.read_text("utf-8") if PATH.exists() else ""
    if text != committed:
        print(stale(committed, text), end="")
        return 1
    print(f"{PATH.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
