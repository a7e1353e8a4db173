"""Endpoint filters as pure logic: what is refused when a filter is saved (and
where), and which payloads pass, each filter evaluated once per publish."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest

from outbox import Outbox, _filters
from outbox._core import PUBLISH_ROUNDS, _Published
from outbox._filters import MAX_FAN_OUT, MAX_FILTER_LENGTH, Verdicts, check_filter, compiled
from outbox.errors import ConfigurationError, InvalidMessage, OutboxError

PAYLOAD = {"amount": 150, "currency": "EUR", "tags": ["vip"], "count": 0, "note": "secret-note"}


def verdicts(texts: list[str], payload: object = PAYLOAD) -> Verdicts:
    judged = Verdicts(json.dumps(payload).encode(), "order.paid")
    judged.judge(texts)
    return judged


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("amount >", "syntax error at character 9: the expression is incomplete"),
        ("tags[0", "syntax error at character 7: the expression is incomplete"),
        ("amount ] 3", "syntax error at character 8: Unexpected token: ]"),
        ('"amount', 'syntax error at character 1: Unclosed " delimiter'),
        # the token at fault is quoted in one line, escaped and cut
        ("amount == \x00", "syntax error at character 11: Unknown token \\x00"),
        ("total(tags)", "unknown function total()"),
        ("length(tags, note)", "length() takes 1 argument(s), 2 given"),
        ("not_null()", "not_null() takes 1 or more argument(s), 0 given"),
        ("", "must be a non-empty JMESPath expression"),
        ("a" * (MAX_FILTER_LENGTH + 1), f"is longer than {MAX_FILTER_LENGTH} characters"),
        (
            "[@, @][][{a: @, b: @, c: @}][] | length(@)",
            f"its multi-selects multiply what it reads by 6, more than {MAX_FAN_OUT}",
        ),
    ],
)
def test_a_filter_is_refused_naming_the_field_and_where_it_fails(text: str, problem: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_filter(text, "--filter")
    assert str(refused.value) == f"--filter: {problem}"


def test_a_refusal_quotes_a_long_token_in_one_bounded_line() -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_filter("`[1,\n" + "2," * 100 + "`")
    assert str(refused.value).startswith("filter: syntax error at character 1: Bad token [1,\\n2,")
    assert str(refused.value).endswith("...") and len(str(refused.value)) < 130
    assert "\n" not in str(refused.value)


def test_a_filter_within_the_bounds_is_kept_as_written() -> None:
    longest = "amount > `1`" + " " * (MAX_FILTER_LENGTH - 12)
    assert check_filter(longest) == longest
    assert check_filter("[@, @][][a, b][] | length(@) > `0`")  # fan-out 4
    assert check_filter(None) is None
    with pytest.raises(InvalidMessage, match="filter: must be a non-empty"):
        check_filter(42)


def test_each_text_is_compiled_once_per_process() -> None:
    text = "currency == 'USD' && amount > `7`"
    assert compiled(text) is compiled(text)


@pytest.mark.parametrize(
    ("text", "passes"),
    [
        ("amount > `100`", True),
        ("amount > `200`", False),
        ("contains(tags, 'vip')", True),
        ("currency == 'EUR' && !contains(tags, 'test')", True),
        ("count", True),  # 0 is truthy in JMESPath
        ("missing", False),  # null
        ("tags[?@ == 'none']", False),  # []
        ("note == 'x' || ''", False),  # ""
        ("amount > `true`", False),  # ordering a number and a boolean: null
    ],
)
def test_a_payload_passes_when_the_result_is_truthy_in_jmespaths_sense(
    text: str, passes: bool
) -> None:
    judged = verdicts([text])
    assert judged.evaluated == [text]
    assert judged.matched == ([text] if passes else [])


def test_the_payload_is_parsed_once_and_each_text_judged_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[bytes] = []
    loads = json.loads

    def counting(data: bytes) -> object:
        parsed.append(data)
        return loads(data)

    monkeypatch.setattr(_filters.json, "loads", counting)
    judged = Verdicts(json.dumps(PAYLOAD).encode(), "order.paid")
    judged.judge(["amount > `100`", "amount > `200`", "amount > `100`"])
    judged.judge(["amount > `200`", "contains(tags, 'vip')"])
    assert len(parsed) == 1
    assert judged.evaluated == ["amount > `100`", "amount > `200`", "contains(tags, 'vip')"]
    assert judged.matched == ["amount > `100`", "contains(tags, 'vip')"]


def test_no_filter_met_means_no_parse() -> None:
    judged = Verdicts(b"not json at all", "order.paid")
    judged.judge([])
    assert (judged.evaluated, judged.matched) == ([], [])


def test_a_filter_that_fails_on_the_payload_does_not_match_and_is_logged_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong_type = "length(amount) > `1`"  # length() of a number
    mixed = "amount > note"  # ordering a number and a string
    with caplog.at_level(logging.WARNING, logger="outbox.filters"):
        judged = verdicts([wrong_type, "amount > `100`", mixed])
    assert judged.matched == ["amount > `100`"]
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "an endpoint filter failed on an event of type order.paid "
        "(JMESPathTypeError in length()) and counts as no match: " + repr(wrong_type),
        "an endpoint filter failed on an event of type order.paid "
        "(TypeError) and counts as no match: " + repr(mixed),
    ]
    # the values at fault are not quoted
    assert not any("150" in line or "secret-note" in line for line in logged)


def test_without_jmespath_a_filter_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "jmespath", None)  # as if not installed
    text = "amount > `12345`"  # never compiled before: not in the cache
    with pytest.raises(ConfigurationError, match=r"pip install 'pg-outbox\[filters\]'"):
        check_filter(text)
    with pytest.raises(ConfigurationError, match=r"pip install 'pg-outbox\[filters\]'"):
        verdicts([text])


def publish_rounds(unevaluated: list[list[str]]) -> list[dict[str, Any]]:
    """Drive publish's plan, the database answering each round with the filters
    it found unjudged (the last answer: the ids written); return each round's
    parameters."""
    box = Outbox()
    params, judged = box._event("order.paid", PAYLOAD, "e-1", None)
    plan = box._publish_plan(params, judged)
    sent: list[dict[str, Any]] = []
    _, round_params, _ = next(plan)
    try:
        for found in unevaluated:
            sent.append(round_params)
            row = (
                _Published(None, None, None, found, True)
                if found
                else _Published([7], None, None, [], True)
            )
            _, round_params, _ = plan.send([row])
    except StopIteration as done:
        assert done.value == [7]
    return sent


def test_publish_judges_the_filters_the_database_finds_then_writes() -> None:
    # the second round finds a filter changed meanwhile: judged too, never passed unjudged
    sent = publish_rounds([["amount > `100`", "amount > `200`"], ["currency == 'EUR'"], []])
    assert [(p["evaluated"], p["matched"]) for p in sent] == [
        ([], []),
        (["amount > `100`", "amount > `200`"], ["amount > `100`"]),
        (
            ["amount > `100`", "amount > `200`", "currency == 'EUR'"],
            ["amount > `100`", "currency == 'EUR'"],
        ),
    ]


def test_publish_gives_up_when_the_filters_keep_changing() -> None:
    changing = [[f"amount > `{n}`"] for n in range(PUBLISH_ROUNDS)]
    with pytest.raises(OutboxError, match=f"changed during each of {PUBLISH_ROUNDS} rounds"):
        publish_rounds(changing)
