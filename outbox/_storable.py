"""Text and JSON that PostgreSQL can store, checked before any statement is sent.

Every free-text field the library writes passes :func:`check_text` (no NUL, no
lone surrogate) and every JSON value it stores or evaluates passes
:func:`check_json` (no ``\\u0000``, no lone surrogate, bounded nesting). Bad input
raises the asking module's error class (:class:`~outbox.errors.InvalidMessage` or
:class:`~outbox.errors.InvalidArgument`) naming the field; the caller's
transaction is untouched.

Design: docs/explanation/design/storable-values.md
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from outbox.errors import InvalidArgument, InvalidMessage

__all__ = ["MAX_JSON_DEPTH", "check_json", "check_text"]

MAX_JSON_DEPTH = 128
"""The deepest a JSON value may nest (objects and arrays): what ``serde_json``
parses by default, far beyond what data needs, and far below Python's recursion
limit (which JMESPath filters and the encoder run into near 1000 levels, fewer
when the caller is deep in its own stack)."""


def text_problem(value: str) -> str | None:
    """What keeps PostgreSQL from storing ``value`` as text, or None."""
    if "\x00" in value:
        return f"holds a NUL character (\\x00) at character {value.index(chr(0)) + 1}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"holds a lone surrogate ({value[exc.start]!r}) at character {exc.start + 1}: "
            "not Unicode text (bytes that are not UTF-8?)"
        )
    return None


def check_text(value: str, field: str, *, error: type[InvalidArgument] = InvalidMessage) -> str:
    """``value`` (a ``str``, checked by the caller) if PostgreSQL can store it; else
    raise ``error`` naming ``field``."""
    problem = text_problem(value)
    if problem is not None:
        raise error(field, problem)
    return value


def check_json(
    value: object,
    field: str,
    *,
    text: bool = True,
    max_depth: int = MAX_JSON_DEPTH,
    max_values: int,
    error: type[InvalidArgument] = InvalidMessage,
) -> None:
    """Raise ``error`` naming ``field`` if ``value`` nests objects and arrays
    deeper than ``max_depth``, holds more than ``max_values`` values in all (as
    encoded: a value referenced twice counts twice), or (with ``text``, for a
    value stored as ``jsonb``) holds a key or string PostgreSQL cannot store; the
    problem says where (``['a'][0]``).

    The walk goes level by level, without recursion, and stops at either bound:
    a cycle, or a value nested thousands deep, costs at most ``max_values``
    steps. Whether the rest is JSON at all is the encoder's to say."""
    if _problem(value, text, max_depth, max_values, paths=False) is None:
        return
    # again, spelling out where: only for a value refused, so the first walk stays lean
    problem = _problem(value, text, max_depth, max_values, paths=True)
    raise error(field, problem or "is not JSON PostgreSQL can store")


def _problem(
    value: object, text: bool, max_depth: int, max_values: int, *, paths: bool
) -> str | None:
    level: list[tuple[object, str]] = [(value, "")]
    count = 1
    for depth in range(max_depth + 1):
        below: list[tuple[object, str]] = []
        for item, path in level:
            if isinstance(item, str):
                if text and (problem := _text_problem(item)) is not None:
                    return f"{problem} in the string at {path or 'the top'}"
                continue
            if isinstance(item, dict):
                pairs: Iterable[tuple[Any, Any]] = item.items()
            elif isinstance(item, list | tuple):
                pairs = enumerate(item)
            else:
                continue
            if depth == max_depth:
                return f"nests deeper than {max_depth} levels (objects and arrays)"
            count += len(item)
            if count > max_values:
                return f"holds more than {max_values:,} values"
            for key, child in pairs:
                step = f"{path}[{_shown(key)}]" if paths else ""
                if text and isinstance(key, str) and (problem := _text_problem(key)):
                    return f"{problem} in the key at {step}"
                below.append((child, step))
        if not below:
            break
        level = below
    return None


def _text_problem(value: str) -> str | None:
    if value.isascii() and "\x00" not in value:  # the common case, cheaply
        return None
    return text_problem(value)


def _shown(key: object) -> str:
    """A key or index as a path shows it: quoted, escaped, cut at 20 characters."""
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    shown = repr(key)
    return shown if len(shown) <= 20 else shown[:17] + "..."
