"""The command line's argument types and its check for missing extras. Pure: no I/O."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchers.cli import _common, build_parser, main
from dispatchers.cli._common import (
    MissingExtra,
    database_id,
    extra_distributions,
    fraction,
    hours,
    list_of,
    non_negative_float,
    parse_duration,
    parse_time,
    positive_float,
    positive_int,
    require_extra,
    seconds,
    seconds_or_zero,
)
from dispatchers.cli.dispatch import config_from_args
from dispatchers.runtime.config import MAX_COUNT, MAX_NUMBER, MAX_SECONDS
from dispatchers.ui.policy_text import format_duration
from outbox.defaults import MAX_SPAN
from outbox.errors import ConfigurationError
from tests.hostile import HOSTILE

ROOT = Path(__file__).resolve().parents[2]


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
    assert str(info.value) == "needs the 'dispatcher' extra: pip install 'pg-outbox[dispatcher]'"


def test_each_extra_brings_what_pyproject_lists_for_it() -> None:
    # read from the installed distribution's metadata, which the build makes from
    # pyproject.toml: an extra that includes another brings that one's too
    extras = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def listed(extra: str) -> set[str]:
        names: set[str] = set()
        for requirement in extras[extra]:
            name = re.match(r"[A-Za-z0-9._-]+(\[([^\]]*)\])?", requirement)
            assert name is not None, requirement
            if name.group(0).startswith("pg-outbox["):
                names |= {n for included in name.group(2).split(",") for n in listed(included)}
            elif ";" not in requirement:  # a platform's only: not required
                names.add(name.group(0).split("[")[0].lower())
        return names

    for extra in ("dispatcher", "embedded", "encryption", "filters", "bench", "ui"):
        assert {n.lower() for n in extra_distributions(extra)} == listed(extra), extra
        require_extra(extra)  # the dev install has them all


def test_a_command_whose_extra_is_missing_says_which_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wanted = {"dispatcher": ("outbox-no-such-distribution",)}
    monkeypatch.setattr(_common, "extra_distributions", wanted.get)
    assert main(["dispatch", "--database-url", "postgresql://nowhere.invalid/x"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "outbox: dispatch needs the 'dispatcher' extra: pip install 'pg-outbox[dispatcher]'\n"
    )


@pytest.mark.parametrize(
    ("parse", "largest"),
    [
        (positive_int, str(MAX_COUNT)),
        (database_id, str(2**63 - 1)),
        (seconds, f"{MAX_SECONDS:g}"),
        (seconds_or_zero, f"{MAX_SECONDS:g}"),
        (positive_float, f"{MAX_NUMBER:g}"),
        (hours, f"{MAX_SPAN / 3600:g}"),
    ],
)
def test_number_types_stop_at_their_documented_maximum(
    parse: Callable[[str], float], largest: str
) -> None:
    parse(largest)
    for bad in (largest + "0", "1e308", "9" * 5000):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be|not an integer"):
            parse(bad)


def test_minus_zero_is_zero_and_refused_where_zero_is() -> None:
    assert str(seconds_or_zero("-0")) == "0.0"
    with pytest.raises(argparse.ArgumentTypeError, match="'-0'"):
        seconds("-0")


def test_a_long_value_is_quoted_cut_short() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        positive_int("9" * 5000)
    assert len(str(info.value)) < 100


@pytest.mark.parametrize("parse", [parse_duration, parse_time])
def test_spans_stop_at_a_hundred_years(parse: Callable[[str], object]) -> None:
    parse(format_duration(MAX_SPAN))
    for bad in ("999999999w", "5215w", "36501d"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"'{bad}' is longer than"):
            parse(bad)


# Each command line is refused before any database is reached (the URL could not
# even be parsed): one line on stderr naming the option, exit status 2.
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["dispatch", "--lease", "inf"], "--lease"),
        (["dispatch", "--grace", "nan"], "--grace"),
        (["dispatch", "--retry-base", "1e300", "--retry-cap", "1e308"], "--retry-base"),
        (["dispatch", "--retry-cap", "1e308"], "--retry-cap"),
        (["dispatch", "--retention", "999999999w"], "--retention"),
        (["dispatch", "--metrics-port", "70000"], "--metrics-port"),
        (["dispatch", "--processes", "1000000"], "--processes"),
        (["dead", "list", "--since", "999999999w"], "--since"),
        (["replay", "--endpoint", "1", "--since", "999999999w"], "--since"),
        (["endpoints", "rotate-secret", "1", "--overlap", "1e308"], "--overlap"),
        (["dead", "retry", "99999999999999999999999"], "ID"),
        (["dead", "purge", "--yes", "9223372036854775808"], "ID"),
        (["messages", "show", "9223372036854775808"], "ID"),
        (["status", "--watch", "inf"], "--watch"),
    ],
)
def test_a_value_out_of_bounds_is_one_line_naming_the_option_and_exit_2(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--database-url", "postgresql://u:pw@[::1/db"])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n")
    assert err.startswith(f"outbox {argv[0]}")
    assert f"argument {named}" in err


def test_a_malformed_database_url_is_one_line_without_its_password_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["status", "--database-url", "postgresql://u:pw@[::1/db"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("outbox status: --database-url: is not a PostgreSQL URL libpq can")
    assert err.count("\n") == 1
    assert "pw" not in err


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OUTBOX_DATABASE_URL": "postgresq://u:pw@localhost/db"}, "$OUTBOX_DATABASE_URL"),
        ({"DATABASE_URL": "postgresq://u:pw@localhost/db"}, "$DATABASE_URL"),
        ({}, "--database-url"),
    ],
)
def test_a_misspelt_scheme_is_named_with_where_the_url_came_from(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    named: str,
) -> None:
    for name in ("OUTBOX_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    given = [] if variables else ["--database-url", "postgresq://u:pw@localhost/db"]
    assert main(["status", *given]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"outbox status: {named}: the scheme must be postgresql:// or postgres://, "
        "not postgresq://\n"
    )


def test_migrate_refuses_postgresqls_own_schema_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["migrate", "--schema", "information_schema"]
    assert main([*argv, "--database-url", "postgresql://nowhere.invalid/x"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("outbox migrate: schema: 'information_schema' is PostgreSQL's own")
    assert err.count("\n") == 1


# Options of the commands that run long (a dispatcher, a benchmark, the demo): their
# values are checked here, by parsing and building what the command would run with.
LONG_RUNNING = {
    "dispatch": [
        "--processes",
        "--concurrency",
        "--batch-size",
        "--lease",
        "--request-timeout",
        "--connect-timeout",
        "--grace",
        "--poll-interval",
        "--claim-window",
        "--claim-timeout",
        "--statement-timeout",
        "--lock-timeout",
        "--retention",
        "--metrics-port",
        "--retry-base",
        "--retry-cap",
    ],
    "bench": ["--messages", "--concurrency", "--repeat", "--rate", "--duration", "--memory-delay"],
    "demo": ["--events", "--rate"],
}


@settings(max_examples=300, deadline=None, database=None)
@given(
    option=st.sampled_from([(c, o) for c, options in LONG_RUNNING.items() for o in options]),
    value=HOSTILE,
)
@pytest.mark.slow
def test_long_running_commands_refuse_hostile_values_in_one_line_or_can_run(
    option: tuple[str, str], value: str
) -> None:
    command, flag = option
    parser = build_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = parser.parse_args([command, f"{flag}={value}"])
        except SystemExit as exc:
            assert exc.code == 2
            assert stderr.getvalue().count("\n") == 1, stderr.getvalue()
            assert "argument " in stderr.getvalue() and flag in stderr.getvalue()
            return
    if command != "dispatch":
        return
    try:
        config = config_from_args(args)
    except ConfigurationError as exc:  # main: one line naming the setting, exit 2
        assert "\n" not in str(exc)
        return
    now = datetime.now(UTC)  # the times derived from the settings must not overflow
    for span in (config.lease, config.grace, config.retention, args.retry_cap):
        assert now - timedelta(seconds=span) <= now <= now + timedelta(seconds=span)
