"""The command line's argument types and its check for missing extras. Pure: no I/O."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from dispatchers.cli import main
from dispatchers.cli._common import (
    EXTRAS,
    MissingExtra,
    format_duration,
    fraction,
    list_of,
    non_negative_float,
    parse_duration,
    parse_time,
    positive_float,
    positive_int,
    require_extra,
)


def test_time_accepts_offsets_z_and_spans_ago_and_rejects_naive_times() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_time("2h", now=now) == now - timedelta(hours=2)
    assert parse_time("30m", now=now) == now - timedelta(minutes=30)
    assert parse_time("7d", now=now) == now - timedelta(days=7)
    assert parse_time("45s", now=now) == now - timedelta(seconds=45)
    assert parse_time("2024-05-01T10:00:00Z") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert parse_time("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    for bad in ("2024-05-01T10:00:00", "2024-05-01", "yesterday", "2x", "-2h", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_time(bad)


@pytest.mark.parametrize("parse", [positive_float, non_negative_float, fraction])
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e999"])
def test_number_types_refuse_infinity_and_nan_naming_the_value(
    parse: Callable[[str], float], text: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        parse(text)


def test_number_types_keep_their_bounds() -> None:
    assert positive_float("0.5") == 0.5
    assert non_negative_float("0") == 0.0
    assert fraction("1") == 1.0
    assert positive_int("20_000") == 20_000
    for parse, bad in (
        (positive_float, "0"),
        (non_negative_float, "-0.1"),
        (fraction, "1.5"),
        (positive_int, "0"),
        (positive_int, "1.5"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            parse(bad)


def test_lists_parse_each_item_and_refuse_repeats() -> None:
    rates = list_of(positive_float)
    assert rates("50, 500,2000") == (50.0, 500.0, 2000.0)
    with pytest.raises(argparse.ArgumentTypeError, match="twice"):
        rates("50,50")
    with pytest.raises(argparse.ArgumentTypeError, match="'inf'"):
        rates("50,inf")


@pytest.mark.parametrize("seconds", [45.0, 90.0, 5400.0, 3600.0, 7 * 86400.0, 14 * 86400.0])
def test_a_formatted_span_reads_back_as_the_same_seconds(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_duration_prefers_days_to_weeks() -> None:
    assert format_duration(7 * 86400.0) == "7d"


def test_require_extra_names_the_extra_when_a_module_is_missing() -> None:
    require_extra("dispatcher", "json")  # present: nothing happens
    with pytest.raises(MissingExtra) as info:
        require_extra("dispatcher", "json", "outbox_no_such_module")
    assert info.value.extra == "dispatcher"
    assert str(info.value) == "needs the 'dispatcher' extra: pip install 'outbox[dispatcher]'"


def test_a_command_whose_extra_is_missing_says_which_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(EXTRAS, "dispatcher", ("outbox_no_such_module",))
    assert main(["dispatch", "--database-url", "postgresql://nowhere.invalid/x"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "outbox: dispatch needs the 'dispatcher' extra: pip install 'outbox[dispatcher]'\n"
    )
