"""Endpoint filters: JMESPath expressions on the payload of a published event.

An endpoint gets a subscribed event only when its filter, applied to ``data``, is
truthy in JMESPath's sense. A filter's shape is bounded when saved
(:data:`MAX_FILTER_LENGTH`, :data:`MAX_FAN_OUT`) and each evaluation's work when
it runs (:data:`MAX_FILTER_STEPS`, :data:`MAX_FILTER_TEXT`, text measured before
it is built), per distinct filter. A failed or over-budget evaluation is no match,
logged without the payload; it never fails the publish. ``jmespath`` is imported
with the first filter compiled.

Design: docs/explanation/design/filters.md
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from outbox.errors import ConfigurationError, InvalidMessage

if TYPE_CHECKING:
    from jmespath.parser import ParsedResult
    from jmespath.visitor import TreeInterpreter

MAX_FILTER_LENGTH = 256
"""The longest filter accepted, in characters."""

MAX_FAN_OUT = 4
"""The most that an expression's multi-selects may multiply what it walks."""

MAX_FILTER_STEPS = 100_000
"""The most steps one evaluation may take: an expression node applied to a
value; a function call counts :data:`CALL_STEPS`, and each element (or key) that
a function or a flatten goes through one more."""

CALL_STEPS = 4
"""The steps of a function call: checking its arguments costs as much as
visiting three nodes."""

MAX_FILTER_TEXT = 1_000_000
"""The most characters of text one evaluation may build: the output of
``to_string`` and ``join``, the only parts of JMESPath that can write more than
they read."""

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
            "filters on the payload need the 'filters' extra: pip install 'pg-outbox[filters]'"
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


class _OverBudget(Exception):
    """An evaluation reached a bound of its budget; says which."""


class _Budget:
    """What one evaluation may still spend: steps, and characters of text."""

    __slots__ = ("steps", "text")

    def __init__(self) -> None:
        self.steps = MAX_FILTER_STEPS
        self.text = MAX_FILTER_TEXT

    def spend(self, steps: int) -> None:
        self.steps -= steps
        if self.steps < 0:
            raise _OverBudget(f"more than {MAX_FILTER_STEPS:,} steps")

    def build(self, characters: int) -> None:
        """Take ``characters`` of text, before they are built."""
        if characters > self.text:
            raise _OverBudget(f"more than {MAX_FILTER_TEXT:,} characters of text")
        self.text -= characters


# the functions whose work goes through each element (or key) of an array (or
# object) argument: to check the elements' types, compare, sort, sum or copy them
_WALKING = frozenset(
    {"avg", "contains", "join", "keys", "map", "max", "max_by", "merge", "min", "min_by"}
    | {"reverse", "sort", "sort_by", "sum", "values"}
)

_CHUNK = 1 << 16
"""Strings longer than this are measured a chunk at a time, so that measuring
one never builds more than twelve times this (a character beyond the BMP is
written as two ``\\u`` escapes)."""


def _string_length(text: str, room: int) -> int:
    """The length of ``text`` as a JSON string in ASCII (``to_string``'s quoting),
    measured no further than past ``room``."""
    if len(text) + 2 > room:
        return len(text) + 2  # escapes only lengthen it
    if len(text) <= _CHUNK:
        return len(encode_basestring_ascii(text))
    length = 2
    for start in range(0, len(text), _CHUNK):
        length += len(encode_basestring_ascii(text[start : start + _CHUNK])) - 2
        if length > room:
            break
    return length


def _json_length(value: object, budget: _Budget) -> int:
    """The length of ``to_string(value)`` (compact JSON in ASCII, as jmespath
    writes it), counted without building it: a step per element and key gone
    through, and no further than past the text left in ``budget``."""
    room = budget.text
    length = 0
    pending = [value]
    while pending and length <= room:
        item = pending.pop()
        if isinstance(item, str):
            length += _string_length(item, room - length)
        elif item is None or item is True:
            length += 4
        elif item is False:
            length += 5
        elif isinstance(item, int):
            length += len(int.__repr__(item))
        elif isinstance(item, float):
            finite = math.isfinite(item)  # else json writes NaN, Infinity or -Infinity
            length += len(float.__repr__(item) if finite else json.dumps(item))
        elif isinstance(item, list):
            budget.spend(len(item))
            length += len(item) + 1 if item else 2  # brackets and commas
            pending.extend(item)
        elif isinstance(item, dict):
            budget.spend(2 * len(item))
            length += 2 * len(item) + 1 if item else 2  # braces, colons and commas
            pending.extend(item)  # keys: strings, in JSON and in JMESPath
            pending.extend(item.values())
        else:  # anything else (an &expression) is written as the string of its str()
            length += _string_length(str(item), room - length)
    return length


@functools.cache
def _interpreter() -> Callable[[_Budget], TreeInterpreter]:
    """JMESPath's interpreter, metered: each visit of a node is a step, and so
    is each element a function or a flatten goes through; ``to_string`` and
    ``join`` take their text from the budget before they build it."""
    _jmespath()
    from jmespath import functions, visitor

    class Functions(functions.Functions):
        def __init__(self, budget: _Budget) -> None:
            self._budget = budget

        def call_function(self, function_name: str, resolved_args: Iterable[Any]) -> Any:
            args = list(resolved_args)
            walked = 0
            if function_name in _WALKING:
                walked = sum(len(a) for a in args if isinstance(a, list | dict))
            self._budget.spend(CALL_STEPS - 1 + walked)  # its node's visit was one
            return super().call_function(function_name, args)

        # as jmespath's own, the length of the text taken from the budget first
        @functions.signature({"types": []})
        def _func_to_string(self, arg: object) -> str:
            if isinstance(arg, str):
                return arg
            self._budget.build(_json_length(arg, self._budget))
            return json.dumps(arg, separators=(",", ":"), default=str)

        @functions.signature({"types": ["string"]}, {"types": ["array-string"]})
        def _func_join(self, separator: str, array: list[str]) -> str:
            self._budget.build(len(separator) * max(len(array) - 1, 0) + sum(map(len, array)))
            return separator.join(array)

    class Interpreter(visitor.TreeInterpreter):
        def __init__(self, budget: _Budget) -> None:
            super().__init__(visitor.Options(custom_functions=Functions(budget)))
            self._budget = budget

        def visit(self, node: Any, *args: Any, **kwargs: Any) -> Any:
            self._budget.spend(1)
            return super().visit(node, *args, **kwargs)

        def visit_flatten(self, node: Any, value: Any) -> Any:
            flat = super().visit_flatten(node, value)
            if flat is not None:  # gone through, element by element: no larger than what it read
                self._budget.spend(len(flat))
            return flat

    return Interpreter


def evaluate(expression: ParsedResult, payload: object) -> Any:
    """``expression`` applied to ``payload`` within a fresh budget; raises
    ``_OverBudget`` where the budget runs out, before building past it."""
    return _interpreter()(_Budget()).visit(expression.parsed, payload)


def _truthy(value: object) -> bool:
    return value is not None and value is not False and value not in ("", [], {})


_UNREAD = object()  # the payload before the first filter met reads it


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
        self._payload: Any = _UNREAD
        self.evaluated: list[str] = []
        self.matched: list[str] = []

    def judge(self, texts: Iterable[str]) -> None:
        """Evaluate the texts not judged yet. A filter that fails to evaluate (or
        that no longer compiles) does not match, and is logged."""
        judged = set(self.evaluated)
        new = [t for t in dict.fromkeys(texts) if t not in judged]
        for text in new:
            self.evaluated.append(text)
            if self._passes(text):
                self.matched.append(text)

    def _passes(self, text: str) -> bool:
        jmespath = _jmespath()  # a ConfigurationError (no extra) is raised, not a verdict
        try:
            if self._payload is _UNREAD:
                self._payload = json.loads(self._data)
            return _truthy(evaluate(compiled(text), self._payload))
        except _OverBudget as exc:
            self._failed(text, f"over budget: {exc}")
        except (
            jmespath.exceptions.JMESPathError,
            TypeError,
            ValueError,
            ArithmeticError,
            RecursionError,
        ) as exc:
            # a function given a value of the wrong type (JMESPathTypeError), an
            # ordering of a number and a string (TypeError, from the comparison
            # itself), ceil() of an infinite or NaN number (OverflowError,
            # ValueError), a payload nested too deep to read, or for to_string
            # or == (RecursionError), a stored filter that no longer compiles
            # (InvalidMessage). The exception's text may quote the payload:
            # name its class and the function only
            function = getattr(exc, "function_name", None)
            self._failed(text, type(exc).__name__ + (f" in {function}()" if function else ""))
        return False

    def _failed(self, text: str, why: str) -> None:
        log.warning(
            "an endpoint filter failed on an event of type %s (%s) and counts as no match: %r",
            self._event_type,
            why,
            text,
            extra={"event_type": self._event_type, "filter": text},
        )
