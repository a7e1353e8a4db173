"""What a dispatcher says of its database: unreachable from the first error
that no server answered, reachable again (one ``reconnected`` event) at the
next answer."""

from __future__ import annotations

import io
import json

import psycopg

from dispatchers.runtime.log import EventLog
from dispatchers.runtime.reporting import Reporter


def _reporter() -> tuple[Reporter, io.StringIO]:
    stream = io.StringIO()
    return Reporter(EventLog(stream=stream, format="json")), stream


def _events(stream: io.StringIO, name: str) -> list[dict[str, object]]:
    return [e for e in map(json.loads, stream.getvalue().splitlines()) if e["event"] == name]


def test_an_outage_is_unreachable_until_the_next_answer_which_says_so_once() -> None:
    report, stream = _reporter()
    assert report.metrics.db_unreachable_since is None
    report.db_error("claim", psycopg.OperationalError("connection failed"))
    since = report.metrics.db_unreachable_since
    assert since is not None
    report.db_error("renew", TimeoutError("no answer"))
    assert report.metrics.db_unreachable_since == since  # when it began
    assert _events(stream, "reconnected") == []

    report.answered("claim")
    report.answered("renew")
    assert report.metrics.db_unreachable_since is None
    (event,) = _events(stream, "reconnected")
    assert (event["operation"], event["errors"], event["level"]) == ("claim", 2, "info")


def test_an_error_the_server_answered_is_no_outage() -> None:
    report, stream = _reporter()
    report.db_error("claim", psycopg.errors.lookup("55P03")("lock not available"))
    assert report.metrics.db_unreachable_since is None
    report.answered("claim")
    assert _events(stream, "reconnected") == []
    assert len(_events(stream, "db_error")) == 1
