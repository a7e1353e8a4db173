"""How commands print: aligned tables and fields for people, JSON for scripts.

Everything printed as text goes through :func:`cell`, which replaces control
characters: error messages and response excerpts come from remote servers, and a
terminal must not interpret them.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]")
UNPRINTABLE_TEXT = re.compile(r"[^\n\t\x20-\x7e\u00a0-\uffff]")
"""Characters replaced in multi-line text (a body): as in a cell, but keeping
newlines and tabs."""


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else the human-readable ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=_json_default, indent=2))
    else:
        print(text)


def cell(value: object, width: int = 60) -> str:
    """One table cell: times in UTC, None as ``-``, control characters (which a
    remote server could put in an error or excerpt) replaced, long text cut."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, float):
        return f"{value:.1f}"
    text = _UNPRINTABLE.sub("?", " ".join(str(value).split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Rows as aligned columns under ``headers``; numbers right-aligned."""
    raw = [list(r) for r in rows]
    cells = [[cell(v) for v in r] for r in raw]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [
        all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in raw if r[i] is not None)
        and any(r[i] is not None for r in raw)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    """``label  value`` lines with the values aligned."""
    width = max(len(label) for label, _ in pairs)
    return "\n".join(f"{label.ljust(width)}  {cell(value, 200)}".rstrip() for label, value in pairs)
