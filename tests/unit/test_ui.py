"""The dashboard's pure parts: the guard's rules, the charts, the command line."""

from __future__ import annotations

import argparse
import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dispatchers.cli import build_parser
from dispatchers.ui.auth import Guard, SignInLimit, host_of, is_loopback, token_id
from dispatchers.ui.charts import Bucket, bars, per_hour, per_minute
from dispatchers.ui.fields import (
    BadInput,
    read_cap,
    read_moment,
    read_since,
    read_text,
    read_webhook_id,
)

NOW = datetime(2024, 5, 1, 12, 30, 42, tzinfo=UTC)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_loopback_is_localhost_or_a_loopback_address(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "host"),
    [("127.0.0.1:8321", "127.0.0.1"), ("[::1]:8321", "::1"), ("localhost", "localhost")],
)
def test_the_host_of_a_host_header_drops_the_port(header: str, host: str) -> None:
    assert host_of(header) == host


def test_without_a_token_only_loopback_host_headers_are_allowed() -> None:
    local = Guard(token=None)
    assert local.allows_host("127.0.0.1:8321") and local.allows_host("localhost:8321")
    assert not local.allows_host("rebound.example:8321") and not local.allows_host(None)
    assert Guard(token="t").allows_host("dashboard.internal:8321")
    assert local.principal == "local" and not local.login_required


def test_a_session_cookie_is_accepted_only_as_signed_by_its_own_guard() -> None:
    guard = Guard(token="t", key=b"k" * 32)
    sid, cookie = guard.new_session()
    assert guard.session_id(cookie) == sid
    assert guard.session_id(sid + ".0") is None
    assert guard.session_id(sid) is None and guard.session_id(None) is None
    assert Guard(token="t", key=b"other" * 8).session_id(cookie) is None  # after a restart


def test_a_csrf_token_belongs_to_one_session() -> None:
    guard = Guard(token=None)
    sid, _ = guard.new_session()
    other, _ = guard.new_session()
    assert guard.accepts_csrf(sid, guard.csrf_token(sid))
    assert not guard.accepts_csrf(sid, guard.csrf_token(other))
    assert not guard.accepts_csrf(sid, None) and not guard.accepts_csrf(sid, "")


def test_the_token_is_checked_and_named_without_being_shown() -> None:
    guard = Guard(token="s3cret")
    assert guard.accepts_token("s3cret")
    assert not guard.accepts_token("s3cre") and not guard.accepts_token("s3cret ")
    assert guard.principal == token_id("s3cret") and "s3cret" not in guard.principal
    assert not Guard(token=None).accepts_token("")
    with pytest.raises(ValueError):
        Guard(token="")


def test_per_minute_fills_every_minute_of_the_hour_oldest_first() -> None:
    minute = NOW.replace(second=0)
    rows = [(minute, 3, 1), (minute - timedelta(minutes=10), 0, 2)]
    buckets = per_minute(rows, now=NOW)
    assert len(buckets) == 60
    assert buckets[0].minute == minute - timedelta(minutes=59)
    assert buckets[-1] == Bucket(minute, 3, 1)
    assert buckets[-11] == Bucket(minute - timedelta(minutes=10), 0, 2)
    assert sum(b.delivered + b.failed for b in buckets) == 6


def test_per_hour_fills_every_hour_of_the_day_and_labels_every_sixth() -> None:
    hour = NOW.replace(minute=0, second=0)
    buckets = per_hour([(hour - timedelta(hours=23), 4, 0)], now=NOW)
    assert len(buckets) == 24
    assert buckets[0] == Bucket(hour - timedelta(hours=23), 4, 0)
    assert buckets[-1] == Bucket(hour, 0, 0)
    svg = str(bars(buckets, label="per hour", tick_every=6))
    assert 'aria-label="per hour"' in svg
    assert svg.count('class="time"') == 5  # 4 ticks and the latest hour


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sign_in_limit_refuses_an_address_after_its_failures_until_they_age_out() -> None:
    clock = _Clock()
    limit = SignInLimit(failures=3, window=60, clock=clock)
    for _ in range(3):
        assert not limit.blocked("10.0.0.1")
        limit.reserve("10.0.0.1")
        clock.now += 10
    assert limit.blocked("10.0.0.1")
    assert not limit.blocked("10.0.0.2")  # per address
    clock.now += 29  # 59 s after the first failure
    assert limit.blocked("10.0.0.1")
    clock.now += 1  # the first failure ages out: one more try
    assert not limit.blocked("10.0.0.1")
    limit.reserve("10.0.0.1")
    assert limit.blocked("10.0.0.1")
    limit.succeeded("10.0.0.1")
    assert not limit.blocked("10.0.0.1")


def test_sign_in_limit_keeps_a_bounded_table() -> None:
    clock = _Clock()
    limit = SignInLimit(failures=1, window=60, clients=2, clock=clock)
    limit.reserve("a")
    clock.now += 61  # a's failure aged out: a goes first
    limit.reserve("b")
    limit.reserve("c")
    assert limit.blocked("b") and limit.blocked("c") and not limit.blocked("a")
    limit.reserve("d")  # none aged out: the longest known (b) goes
    assert not limit.blocked("b") and limit.blocked("c") and limit.blocked("d")


def test_bars_stack_failures_on_deliveries_under_a_round_scale() -> None:
    buckets = per_minute([(NOW.replace(second=0), 30, 7)], now=NOW)
    svg = str(bars(buckets))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('<rect class="delivered"') == 1 and svg.count('<rect class="failed"') == 1
    assert ">50</text>" in svg  # 37 attempts: the scale tops at 50
    assert "<rect" not in str(bars(per_minute([], now=NOW)))


def _scale(svg: str) -> list[tuple[float, int]]:
    found = re.findall(r'<text class="scale" x="[\d.]+" y="([\d.]+)"[^>]*>(\d+)</text>', svg)
    return [(float(y), int(value)) for y, value in found]


@pytest.mark.parametrize(
    ("peak", "labels"),
    [
        (150, [0, 50, 100, 150, 200]),
        (37, [0, 10, 20, 30, 40, 50]),
        (2, [0, 1, 2]),
        (1, [0, 1]),
        (0, [0, 1]),
        (1500, [0, 500, 1000, 1500, 2000]),
    ],
)
def test_the_scale_labels_round_steps_from_zero_to_its_top(peak: int, labels: list[int]) -> None:
    svg = str(bars(per_minute([(NOW.replace(second=0), peak, 0)], now=NOW)))
    scale = _scale(svg)
    assert [value for _, value in scale] == labels
    heights = [y for y, _ in scale]
    assert heights == sorted(heights, reverse=True)  # zero at the bottom, the top above
    gaps = {round(a - b, 1) for a, b in itertools.pairwise(heights)}
    assert len(gaps) == 1  # evenly spaced
    assert svg.count('<line class="grid"') == len(labels) - 1


def _ui_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices["ui"]
    return parser


def test_every_option_of_outbox_ui_has_help_and_the_command_a_description() -> None:
    parser = _ui_parser()
    assert parser.description and "dashboard" in parser.description
    options = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert {o for a in options for o in a.option_strings} >= {
        "--database-url",
        "--schema",
        "--host",
        "--port",
        "--read-only",
        "--token-file",
    }
    assert [a.dest for a in options if not a.help or a.help == argparse.SUPPRESS] == []


def test_outbox_ui_defaults_to_loopback_on_port_8321() -> None:
    args = _ui_parser().parse_args([])
    assert (args.host, args.port, args.read_only, args.token_file) == (
        "127.0.0.1",
        8321,
        False,
        None,
    )


def test_the_token_comes_from_the_file_else_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatchers.cli.ui import _token

    monkeypatch.setenv("OUTBOX_UI_TOKEN", "from-env")
    assert _token(argparse.Namespace(token_file=None)) == "from-env"
    path = tmp_path / "token"
    path.write_text("from-file\nsecond line\n")
    assert _token(argparse.Namespace(token_file=str(path))) == "from-file"
    monkeypatch.setenv("OUTBOX_UI_TOKEN", "")
    assert _token(argparse.Namespace(token_file=None)) is None


def test_a_webhook_id_names_its_key_and_endpoint() -> None:
    assert read_webhook_id({"webhook_id": " evt_1:order:7 "}) == ("evt_1:order:7", 7)
    assert read_webhook_id({}) == (None, None)
    for bad in ("evt_1", "evt_1:", "evt_1:0", "evt_1:x7", "evt_1:٣"):
        with pytest.raises(BadInput, match="webhook_id"):
            read_webhook_id({"webhook_id": bad})


def test_a_time_without_an_offset_is_utc_and_one_with_keeps_it() -> None:
    assert read_moment({"from": "2024-05-01T12:30"}, "from") == NOW.replace(second=0)
    given = read_moment({"from": "2024-05-01T14:30+02:00"}, "from")
    assert given == NOW.replace(second=0) and given is not None and given.utcoffset()
    with pytest.raises(BadInput, match="until"):
        read_moment({"until": "yesterday"}, "until")


@pytest.mark.parametrize("value", ["0", "10001", "-1", "2.5", "x"])
def test_a_cap_is_a_whole_number_in_range(value: str) -> None:
    assert read_cap({"cap": " "}) is None and read_cap({"cap": "10000"}) == 10000
    with pytest.raises(BadInput, match="cap"):
        read_cap({"cap": value})


def test_sign_in_attempts_are_counted_as_they_start_so_none_passes_the_limit_in_flight() -> None:
    limit = SignInLimit(failures=3, window=60, clock=_Clock())
    started = [limit.reserve("10.0.0.1") for _ in range(10)]  # none judged yet
    assert started == [True] * 3 + [False] * 7
    limit.succeeded("10.0.0.1")  # one of them was right: the address starts afresh
    assert limit.reserve("10.0.0.1")


@pytest.mark.parametrize("name", ["key", "event_type", "webhook_id", "reason"])
def test_a_text_field_with_a_nul_is_refused_naming_it(name: str) -> None:
    with pytest.raises(BadInput, match=f"{name}: contains a NUL"):
        read_text({name: "a\x00b"}, name)


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59-23:59"])
def test_a_time_whose_instant_is_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match=r"since: .* is out of range"):
        read_since({"since": value})
    with pytest.raises(BadInput, match=r"from: .* is out of range"):
        read_moment({"from": value}, "from")


def test_the_guard_refuses_a_csrf_token_or_cookie_of_any_character() -> None:
    guard = Guard(token=None)
    sid, _ = guard.new_session()
    assert not guard.accepts_csrf(sid, "\u00e9\x00")
    assert guard.session_id("x.\u00e9") is None and guard.session_id("x.\udcff") is None
