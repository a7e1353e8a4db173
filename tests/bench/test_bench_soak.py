"""``outbox bench --scenario soak``, shortened: a row per interval, a dispatcher
restarted after each, a receiver that fails and stalls, and nothing lost."""

from __future__ import annotations

import pytest

from dispatchers.cli import main
from tests.bench.test_bench import bench_schemas, child_commands, run_bench

SHORT = ("--duration", "20", "--soak-interval", "5", "--soak-rate", "40")


@pytest.mark.slow
def test_soak_reports_each_interval_and_loses_nothing_across_restarts(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_bench(capsys, "--database-url", database_url, "--scenario", "soak", *SHORT)

    assert code == 0, report
    assert list(report["scenarios"]) == ["soak"]
    soak = report["scenarios"]["soak"]
    assert soak["ok"], soak["failures"]
    intervals = soak["intervals"]
    assert [i["number"] for i in intervals] == [1, 2, 3, 4]
    assert soak["restarts"] == 3  # after every interval but the last
    # nothing lost: every committed message reached the receiver, none twice
    assert soak["committed"] == soak["delivered"] >= 4 * 5 * 40 * 0.9
    assert (soak["retrying"], soak["dead"], soak["lost"], soak["duplicates"]) == (0, 0, 0, 0)
    # the receiver failed 5% of the requests and answered 5% late: every 20th of each
    requests = soak["delivered"] + soak["failed_requests"]
    assert soak["failed_requests"] == requests // 20
    assert soak["delayed_requests"] == (soak["delivered"] + soak["failed_requests"] + 10) // 20
    for interval in intervals:
        assert interval["committed"] > 0
        assert interval["delivered"] > 0
        assert -50 < interval["lag_p50_ms"] <= interval["lag_p99_ms"] < 60_000
        rss = interval["rss_mb"]
        assert len(rss) == 2
        assert all(10 < mb < 10_000 for mb in rss)  # both processes up at every mark
        assert 0 < interval["messages_indexes_mb"] < interval["messages_mb"]
    # each arrival counts in one interval; the rest arrived while draining
    assert sum(i["delivered"] for i in intervals) <= soak["delivered"]
    assert sum(i["committed"] for i in intervals) <= soak["committed"]
    # four intervals: the first is the warm-up, the three after it are judged
    (rss,) = soak["rss"]  # the dispatcher never restarted
    assert rss["warmup_intervals"] == soak["messages_size"]["warmup_intervals"] == 1
    # each verdict judges the figures measured: the steady dispatcher (the first;
    # the last is the one restarted) and the table, warm-up against the rest
    steady = [i["rss_mb"][0] for i in intervals]
    table = [i["messages_mb"] for i in intervals]
    for trend, values in ((rss, steady), (soak["messages_size"], table)):
        assert trend["warmup_peak"] == max(values[:1])
        assert trend["later_peak"] == max(values[1:])
        assert isinstance(trend["flat"], bool)  # four intervals: a verdict, not "open"

    measures = [row["measure"] for row in report["table"] if row["scenario"] == "soak"]
    assert [m for m in measures if m.startswith("  to ")] == [
        "  to 5 s",
        "  to 10 s",
        "  to 15 s",
        "  to 20 s",
    ]
    assert "committed / delivered / retrying / dead / lost / duplicates" in measures
    assert bench_schemas(database_url) == []
    assert not [c for c in child_commands() if "receiver.py" in c or " dispatch " in c]


def test_help_says_soak_runs_only_when_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert "soak runs only when named" in text
    assert "--soak-interval" in text
