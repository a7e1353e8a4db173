"""Endpoint filters: JMESPath expressions on the payload of a published event.

An endpoint with a filter gets an event of a type it subscribes to only when the
expression, applied to the event's payload (its ``data``, as the receiver will
read it), is truthy in JMESPath's sense: anything but ``null``, ``false``, ``""``,
``[]`` and ``{}`` (so ``0`` is truthy, as in JMESPath's own ``&&`` and ``||``).

JMESPath reads; it cannot call out, loop or name anything but the payload, so a
filter's cost is bounded by the expression and the payload. Both are bounded: a
filter is at most :data:`MAX_FILTER_LENGTH` characters, a payload at most the
``Outbox``'s ``max_body_bytes``. One construct alone copies what it selects, the
multi-select (``[a, b]``, ``{x: a, y: b}``): chained behind flattens, each would
multiply the size of what later steps walk, so the widths of an expression's
multi-selects multiply to at most :data:`MAX_FAN_OUT`. Every step then walks at
most ``MAX_FAN_OUT`` times the payload's values.

Filters are checked before they are written (:func:`check_filter`: syntax,
functions and their arity, the bounds), compiled once per text and process
(:func:`compiled`), and evaluated by :class:`Verdicts`, once per distinct text
per publish on a payload parsed once. An evaluation that fails (a function given
a value of the wrong type, ``<`` between a number and a string) counts as no
match and is logged, one warning per failure and without the payload, on the
``outbox.filters`` logger.

JMESPath comes from ``jmespath`` (the ``filters`` extra), imported with the first
filter compiled: the library's plain install neither needs nor loads it.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from outbox.errors import ConfigurationError, InvalidMessage

if TYPE_CHECKING:
    from jmespath.parser import ParsedResult

MAX_FILTER_LENGTH = 256
"""The longest filter accepted, in characters."""

MAX_FAN_OUT = 4
"""The most that an expression's multi-selects may multiply what it walks."""

COMPILED_CACHE = 1024
"""How many compiled filters a process keeps, by text."""

log = logging.getLogger("outbox.filters")


def check_filter(value: object, field: str = "filter") -> str | None:
    """A filter as it will be stored: None (no filter) or an expression that
    compiles within the bounds; raises :class:`outbox.InvalidMessage` naming
    ``field`` (and, for a syntax error, the character at fault)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidMessage(field, "must be a non-empty JMESPath expression")
    if len(value) > MAX_FILTER_LENGTH:
        raise InvalidMessage(field, f"is longer than {MAX_FILTER_LENGTH} characters")
    try:
        compiled(value)
    except InvalidMessage as exc:
        raise InvalidMessage(field, exc.problem) from None
    return value


@functools.lru_cache(maxsize=COMPILED_CACHE)
def compiled(text: str) -> ParsedResult:
    """``text`` compiled, once per process while it stays among the most recent
    :data:`COMPILED_CACHE` texts; raises :class:`outbox.InvalidMessage` if it is
    not a filter :func:`check_filter` accepts."""
    jmespath = _jmespath()
    try:
        expression: ParsedResult = jmespath.compile(text)
    except jmespath.exceptions.ParseError as exc:
        raise InvalidMessage("filter", _syntax_error(text, exc, jmespath.exceptions)) from None
    _check_calls(expression.parsed, jmespath.functions.Functions.FUNCTION_TABLE)
    fan_out = _fan_out(expression.parsed)
    if fan_out > MAX_FAN_OUT:
        raise InvalidMessage(
            "filter",
            f"its multi-selects multiply what it reads by {fan_out}, more than {MAX_FAN_OUT}",
        )
    return expression


def _jmespath() -> Any:
    try:
        import jmespath
    except ImportError:
        raise ConfigurationError(
            "filters on the payload need the 'filters' extra: pip install 'outbox[filters]'"
        ) from None
    return jmespath


def _syntax_error(text: str, exc: Any, exceptions: Any) -> str:
    """A parse error as one line: where (1-based, as an editor counts) and why."""
    position = exc.lex_position if isinstance(exc.lex_position, int) else len(text)
    if isinstance(exc, exceptions.IncompleteExpressionError):
        reason = "the expression is incomplete"
    else:
        # a LexerError says why in .message; a ParseError in .msg. Either may
        # quote the token at fault: shown escaped, and cut, to stay one line
        reason = _one_line(getattr(exc, "message", None) or exc.msg)
    return f"syntax error at character {position + 1}: {reason}"


def _one_line(text: str, limit: int = 80) -> str:
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _nodes(node: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield node
    for child in node.get("children", ()):
        if isinstance(child, Mapping):
            yield from _nodes(child)


def _check_calls(tree: Mapping[str, Any], table: Mapping[str, Any]) -> None:
    """Refuse a call of a function JMESPath lacks, or with the wrong number of
    arguments, now rather than at each publish (JMESPath checks them only when
    the call is reached)."""
    for node in _nodes(tree):
        if node["type"] != "function_expression":
            continue
        name, given = node["value"], len(node["children"])
        if name not in table:
            raise InvalidMessage("filter", f"unknown function {name}()")
        signature = table[name]["signature"]
        variadic = bool(signature) and signature[-1].get("variadic", False)
        if given < len(signature) or (given > len(signature) and not variadic):
            expected = f"{len(signature)}{' or more' if variadic else ''}"
            raise InvalidMessage("filter", f"{name}() takes {expected} argument(s), {given} given")


def _fan_out(tree: Mapping[str, Any]) -> int:
    product = 1
    for node in _nodes(tree):
        if node["type"] in ("multi_select_list", "multi_select_dict"):
            product *= max(len(node["children"]), 1)
    return product


def _truthy(value: object) -> bool:
    return value is not None and value is not False and value not in ("", [], {})


class Verdicts:
    """Which filters one event's payload passes: each distinct text is evaluated
    once, on the payload parsed once (from ``data``, the payload's JSON as
    published), and only when a filter is met.

    ``evaluated`` and ``matched`` are the texts judged so far and those that
    passed, as ``publish`` sends them to the database.
    """

    def __init__(self, data: bytes, event_type: str) -> None:
        self._data = data
        self._event_type = event_type
        self._payload: Any = None
        self.evaluated: list[str] = []
        self.matched: list[str] = []

    def judge(self, texts: Iterable[str]) -> None:
        """Evaluate the texts not judged yet. A filter that fails to evaluate (or
        that no longer compiles) does not match, and is logged."""
        judged = set(self.evaluated)
        new = [t for t in dict.fromkeys(texts) if t not in judged]
        if not new:
            return
        if not self.evaluated:
            self._payload = json.loads(self._data)
        for text in new:
            self.evaluated.append(text)
            if self._passes(text):
                self.matched.append(text)

    def _passes(self, text: str) -> bool:
        jmespath = _jmespath()
        try:
            return _truthy(compiled(text).search(self._payload))
        except (jmespath.exceptions.JMESPathError, TypeError, InvalidMessage) as exc:
            # a function given a value of the wrong type (JMESPathTypeError), an
            # ordering of a number and a string (TypeError, from the comparison
            # itself), a stored filter that no longer compiles. The exception's
            # text may quote the payload: name its class and the function only
            function = getattr(exc, "function_name", None)
            log.warning(
                "an endpoint filter failed on an event of type %s (%s%s) and counts "
                "as no match: %r",
                self._event_type,
                type(exc).__name__,
                f" in {function}()" if function else "",
                text,
                extra={"event_type": self._event_type, "filter": text},
            )
            return False
