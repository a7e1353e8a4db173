"""The budget of one filter evaluation: steps, and characters of text built.

A filter within the bounds checked when it is saved can still be made to work
hard by the payload; these tests pin down that the work stops at the budget,
before the memory is taken, and that a filter over budget counts as no match,
logged without the payload."""

from __future__ import annotations

import json
import logging
import sys
import tracemalloc
from typing import Any

import jmespath
import pytest
from jmespath.functions import Functions

from outbox import _filters
from outbox._filters import (
    MAX_FILTER_STEPS,
    MAX_FILTER_TEXT,
    Verdicts,
    _interpreter,
    _json_length,
    check_filter,
    compiled,
    evaluate,
)

MB = 1 << 20

# each layer JSON-encodes the one inside, escaping every quote: twice the text
DOUBLING = "to_string(to_array(" * 12 + "a" + "))" * 12
QUOTES = {"a": '"' * 125_000}


def judged_with_peak(text: str, payload: object) -> tuple[Verdicts, int]:
    """The verdict on ``payload`` of ``text``, and the most memory the judging
    (parse and evaluation) held at once."""
    judged = Verdicts(json.dumps(payload).encode(), "order.paid")
    tracemalloc.start()
    try:
        judged.judge([text])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return judged, peak


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "outbox.filters"]


def test_a_filter_that_doubles_its_text_twelve_times_stops_before_it_builds_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert len(DOUBLING) == 253 and check_filter(DOUBLING) == DOUBLING  # saved as valid
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        judged, peak = judged_with_peak(DOUBLING, QUOTES)
    assert (judged.evaluated, judged.matched) == ([DOUBLING], [])
    assert failures(caplog) == [
        "an endpoint filter failed on an event of type order.paid (over budget: more than "
        f"{MAX_FILTER_TEXT:,} characters of text) and counts as no match: {DOUBLING!r}"
    ]
    # unbounded, the twelfth layer alone is 512 million characters
    assert peak < 16 * MB


def test_join_takes_its_text_from_the_budget_before_joining(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a 100,000-character separator between 50,000 empty strings: 5 billion characters
    payload = {"sep": "x" * 100_000, "parts": [""] * 50_000}
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        judged, peak = judged_with_peak("join(sep, parts)", payload)
    assert judged.matched == []
    assert "characters of text" in failures(caplog)[0]
    assert peak < 16 * MB


@pytest.mark.parametrize(
    ("text", "payload"),
    [
        # every node applied to each of 40,000 elements, 3 nodes
        ("@[?@ > `1`]", list(range(40_000))),
        # a flatten goes through each element, and 4 sorts through 40,000 each
        ("@" + "[]" * 100, [0] * 60_000),
        ("[sort(@), sort(@), sort(@), sort(@)]", list(range(40_000))),
        # nested projections over nested arrays: each leaf is a step
        ("@[*][*][*].to_string(@)", [[[i, i] for i in range(50)] for _ in range(400)]),
    ],
    ids=["filter-projection", "flattens", "sorts", "projections"],
)
def test_a_filter_that_takes_too_many_steps_stops_there(
    text: str, payload: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        assert verdict(text, payload) is False
    assert failures(caplog) == [
        "an endpoint filter failed on an event of type order.paid (over budget: more than "
        f"{MAX_FILTER_STEPS:,} steps) and counts as no match: {text!r}"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "length(@) > `0`",  # a call that does not go through the elements
        "sort(@)[0] == `0`",
        "contains(@, `39999`)",
        "length(to_string(@)) > `200000`",
        "max(@) == `39999`",
    ],
)
def test_a_filter_that_goes_through_a_large_payload_a_few_times_is_within_budget(
    text: str,
) -> None:
    assert verdict(text, list(range(40_000))) is True


def test_text_up_to_the_budget_is_built_and_a_character_more_is_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_filters, "MAX_FILTER_TEXT", 100)
    # ["..."]: 4 characters around the string; a quote, a control character and
    # one beyond the BMP are written as 2, 6 and 12
    inside = '"\x01\U0001f600' + "x" * 76
    assert len(json.dumps([inside], separators=(",", ":"))) == 100
    exact = "to_string(to_array(a))"
    assert verdict(exact, {"a": inside}) is True
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        assert verdict(exact, {"a": inside + "x"}) is False
        # two texts of 50 are the budget too: it is spent by the evaluation
        assert verdict("[to_string(a), to_string(a)]", {"a": ["x" * 46]}) is True
        assert verdict("[to_string(a), to_string(a)]", {"a": ["x" * 47]}) is False
        assert verdict("join(sep, parts)", {"sep": "--", "parts": ["x" * 49] * 2}) is True
        assert verdict("join(sep, parts)", {"sep": "---", "parts": ["x" * 49] * 2}) is False
    assert len(failures(caplog)) == 3
    assert all("more than 100 characters of text" in line for line in failures(caplog))


def verdict(text: str, payload: object) -> bool:
    judged = Verdicts(json.dumps(payload).encode(), "order.paid")
    judged.judge([text])
    return judged.matched == [text]


VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -12,
    10**400,
    1.5,
    -2.5e-300,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    'quote " backslash \\ tab \t nul \x00 del \x7f',
    "é ü ß € \U0001f600 \u2028",
    "x" * 200 + '"' * 100 + "\x01" * 50 + "\U0001f600" * 30,
    [],
    {},
    [1, [2, [3, {"k": "v"}]], {"a": [], "b": {}}],
    {"é": {"\U0001f600": [None, True, 1.0]}, "": ""},
]


@pytest.mark.parametrize("chunk", [_filters._CHUNK, 7])
def test_to_strings_length_is_measured_exactly_without_building_it(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_filters, "_CHUNK", chunk)  # 7: long strings measured in pieces
    for value in VALUES:
        written = json.dumps(value, separators=(",", ":"))
        assert _json_length(value, _filters._Budget()) == len(written), value


@pytest.mark.parametrize(
    "text",
    [
        "to_string(@)",
        "[to_string(a), to_string(b), to_string(c)]",
        "join(', ', keys(@))",
        "join(d, [d, d, d])",
        "map(&to_string(@), values(@))",
        "to_string(&a)",
    ],
)
def test_the_metered_functions_give_what_jmespaths_own_give(text: str) -> None:
    payload = {"a": VALUES, "b": VALUES[-1], "c": "é\U0001f600", "d": '"\\\x01\u00e9'}
    expected = jmespath.search(text, payload)
    got = evaluate(compiled(text), payload)
    if text == "to_string(&a)":  # the text of an object, named by its address
        assert got.startswith('"<jmespath.visitor._Expression object at 0x')
    else:
        assert got == expected


def test_the_metered_functions_are_jmespaths_own_by_name_and_signature() -> None:
    interpreter = _interpreter()(_filters._Budget())
    table = interpreter._functions.FUNCTION_TABLE
    assert {name: spec["signature"] for name, spec in table.items()} == {
        name: spec["signature"] for name, spec in Functions.FUNCTION_TABLE.items()
    }


@pytest.mark.parametrize(
    ("text", "payload", "error"),
    [
        ("ceil(to_number(price)) > `1`", {"price": "1e999"}, "OverflowError"),
        ("floor(to_number(price)) > `1`", {"price": "nan"}, "ValueError"),
        ("avg(amounts) > `1`", {"amounts": [10**400]}, "OverflowError"),
    ],
)
def test_arithmetic_that_fails_on_the_payload_counts_as_no_match(
    text: str, payload: object, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        assert verdict(text, payload) is False
    assert failures(caplog) == [
        f"an endpoint filter failed on an event of type order.paid ({error}) and counts "
        f"as no match: {text!r}"
    ]


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def headroom() -> int:
    """How many levels of recursion are left below the interpreter's limit."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return sys.getrecursionlimit() - depth


@pytest.mark.parametrize(
    ("text", "names"),
    [
        # 120 levels of multi-select around the payload: too deep to encode
        ("to_string(" + "[" * 120 + "@" + "]" * 120 + ")", []),
        # 60 around each side: too deep to compare
        ("[" * 60 + "a" + "]" * 60 + " == " + "[" * 60 + "b" + "]" * 60, ["a", "b"]),
    ],
    ids=["to_string", "equals"],
)
def test_a_payload_nested_too_deep_for_the_filter_counts_as_no_match(
    text: str, names: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    deep = nested(headroom() - 40)  # read, and written, with 40 levels to spare
    payload = {name: deep for name in names} if names else deep
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        assert verdict(text, payload) is False
    assert [line.split("(")[1].split(")")[0] for line in failures(caplog)] == ["RecursionError"]


def test_a_payload_too_deep_to_read_counts_as_no_match_for_each_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    judged = Verdicts(b"[" * 100_000 + b"]" * 100_000, "order.paid")
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        judged.judge(["length(@) > `0`", "@"])
    assert (judged.evaluated, judged.matched) == (["length(@) > `0`", "@"], [])
    assert len(failures(caplog)) == 2
    assert all("(RecursionError)" in line for line in failures(caplog))
