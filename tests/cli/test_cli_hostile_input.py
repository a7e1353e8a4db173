"""The operator commands refuse hostile values cleanly: exit status 2 with one line
naming what is wrong and nothing written, or a clean result; never a traceback.

Commands run in-process (``dispatchers.cli.main``) against the test's database,
seeded with an endpoint, dead messages and a delivered one, so that the values
that pass reach the statements that write.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchers.cli import main
from dispatchers.cli._common import MAX_KEY_FILE
from outbox import Outbox
from outbox._endpoint_tls import MAX_PEM
from outbox.endpoints import Endpoints
from tests.hostile import HOSTILE, URLS

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("endpoints", "destination_slots", "messages", "message_keys", "delivered", "attempts")

HOSTILE_PROPERTY = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

MALFORMED_DATABASE_URLS = st.sampled_from(
    [
        "postgresql://u:pw@[::1/db",
        "postgresql://[::1",
        "postgres://u:pw@[::1]x/db",
        "postgresql://u:pw@host/db?unknown_option=1",
    ]
)

# (command line, what fills its "{}")
COMMANDS: list[tuple[list[str], st.SearchStrategy[str]]] = [
    (["dead", "list", "--since={}"], HOSTILE),
    (["dead", "list", "--limit={}"], HOSTILE),
    (["dead", "list", "--endpoint={}"], HOSTILE),
    (["dead", "retry", "{}"], HOSTILE),
    (["dead", "retry", "--all", "--attempts={}"], HOSTILE),
    (["dead", "retry", "--since={}"], HOSTILE),
    (["dead", "purge", "--yes", "{}"], HOSTILE),
    (["dead", "purge", "--yes", "--endpoint={}"], HOSTILE),
    (["replay", "--endpoint={}", "--since=1h"], HOSTILE),
    (["replay", "--endpoint=1", "--since={}"], HOSTILE),
    (["replay", "--endpoint=1", "--since=2h", "--until={}"], HOSTILE),
    (["messages", "show", "{}"], HOSTILE),
    (["status", "--max-lag={}"], HOSTILE),
    (["status", "--schema={}"], HOSTILE),
    (["endpoints", "show", "{}"], HOSTILE),
    (["endpoints", "disable", "{}"], HOSTILE),
    (["endpoints", "rotate-secret", "1", "--overlap={}"], HOSTILE),
    (["endpoints", "add", "https://example.com/h", "--max-concurrency={}"], HOSTILE),
    (["endpoints", "add", "{}"], URLS),
    (["endpoints", "update", "1", "--url={}"], URLS),
    (["endpoints", "update", "1", "--filter={}"], HOSTILE),
]


class Cli:
    """Runs ``outbox ...`` in-process against one database."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys
        self.conn = psycopg.connect(url, autocommit=True)  # for the test's own queries

    def __call__(self, *argv: str, database_url: str | None = None) -> tuple[int, str, str]:
        """Exit status, stdout and stderr; any exception but argparse's exit (a
        traceback, were it a process) fails the test."""
        self.capsys.readouterr()
        try:
            code = main([*argv, "--database-url", database_url or self.url])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else -1
        out, err = self.capsys.readouterr()
        return code, out, err

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else []

    def tables(self) -> list[tuple[Any, ...]]:
        """A digest of every row of every table: equal if and only if nothing changed."""
        digests = ", ".join(
            f"(SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM outbox.{table} AS t)"
            for table in TABLES
        )
        return self.query(f"SELECT {digests}")


@pytest.fixture
def cli(database_url: str, capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    """An endpoint (id 1), two dead messages, a waiting one and a delivered one."""
    with psycopg.connect(database_url) as conn:
        Endpoints().add(conn, url="https://example.com/wh", event_types=["a.b"])
        Outbox().publish(conn, "a.b", {"n": 1}, idempotency_key="e1")
        for key in ("d1", "d2", "w1"):
            Outbox().enqueue(conn, url="https://example.com/x", idempotency_key=key, json=key)
    tool = Cli(database_url, capsys)
    tool.query(
        "UPDATE outbox.messages SET state = 'dead', attempts = 2, completed_at = now()"
        " WHERE idempotency_key IN ('d1', 'd2')"
    )
    now = datetime.now(UTC)
    tool.query(
        "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, method,"
        " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
        " created_at, completed_at) VALUES (4242, 'evt:old', 'endpoint:1', 1, 'POST', '{}',"
        " 'x', 'application/json', 'a.b', 1, 8, 200, %s, %s)",
        now - timedelta(hours=1),
        now - timedelta(hours=1),
    )
    yield tool
    tool.conn.close()


def assert_clean(cli: Cli, argv: list[str], database_url: str | None = None) -> int:
    """Run ``argv``: exit status 2 is one line on stderr and changed nothing; any other
    status is a result (0, or 1 for ids that named no dead message or a lag over the
    bound). A database error (exit status 1) means a value got past the checks to
    the server: only a schema that does not exist may get there."""
    before = cli.tables()
    code, _, err = cli(*argv, database_url=database_url)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err
    if "database error" in err:
        assert "does not exist" in err and any(a.startswith("--schema=") for a in argv), err
    if code == 2:
        assert err.count("\n") == 1 and err.endswith("\n"), (argv, err)
        assert err.startswith("outbox"), (argv, err)
        assert cli.tables() == before, argv
    return code


# -- ids of dead messages ------------------------------------------------------------


def dead_ids(cli: Cli) -> list[int]:
    return [i for (i,) in cli.query("SELECT id FROM outbox.messages WHERE state = 'dead'")]


def test_dead_retry_names_the_ids_of_no_dead_message_and_exits_1(cli: Cli) -> None:
    first, second = sorted(dead_ids(cli))
    code, out, err = cli("dead", "retry", str(first), "999999", "999998")
    assert code == 1
    assert out.startswith("retried 1 dead message(s)")
    assert err == "outbox dead retry: no dead message with id 999998, 999999\n"
    assert dead_ids(cli) == [second]

    code, out, err = cli("dead", "retry", str(first), "--json")  # ready now, not dead
    assert (code, json.loads(out)) == (1, {"retried": 0})
    assert err == f"outbox dead retry: no dead message with id {first}\n"


def test_dead_purge_names_the_ids_of_no_dead_message_and_exits_1(cli: Cli) -> None:
    first, second = sorted(dead_ids(cli))
    code, out, err = cli("dead", "purge", "--yes", str(first), "999999")
    assert code == 1
    assert out.strip() == "purged 1 dead message(s)"
    assert err == "outbox dead purge: no dead message with id 999999\n"
    assert dead_ids(cli) == [second]
    code, _, _ = cli("dead", "purge", "--yes", str(second))
    assert code == 0


@pytest.mark.parametrize("action", [["retry"], ["purge", "--yes"]])
def test_an_id_past_bigint_is_one_line_and_exit_2_and_nothing_changes(
    cli: Cli, action: list[str]
) -> None:
    first, _ = sorted(dead_ids(cli))
    before = cli.tables()
    code, out, err = cli("dead", *action, str(first), "99999999999999999999999")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "argument ID: '99999999999999999999999'" in err
    assert cli.tables() == before


# -- every option, hostile values ------------------------------------------------------


@pytest.mark.parametrize(("argv", "values"), COMMANDS, ids=[" ".join(c) for c, _ in COMMANDS])
@HOSTILE_PROPERTY
@given(data=st.data())
@pytest.mark.slow
def test_hostile_values_are_refused_in_one_line_or_give_a_clean_result(
    cli: Cli, argv: list[str], values: st.SearchStrategy[str], data: st.DataObject
) -> None:
    value = data.draw(values)
    assert_clean(cli, [part.replace("{}", value) for part in argv])


@HOSTILE_PROPERTY
@given(url=MALFORMED_DATABASE_URLS, argv=st.sampled_from([c for c, _ in COMMANDS]))
@pytest.mark.slow
def test_a_malformed_database_url_is_refused_in_one_line(
    cli: Cli, url: str, argv: list[str]
) -> None:
    filled = [part.replace("{}", "1") for part in argv]
    assert assert_clean(cli, filled, database_url=url) == 2


# -- what PostgreSQL cannot store, and JSON nested past any parser -------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        "[" * 5_000,
        '{"a":' * 5_000,
        '{"a":' * 200 + "1" + "}" * 200,
        '{"a":"\\u0000"}',
        '{"\\u0000":1}',
        '{"a":["\\ud800"]}',
        '{"a":' + json.dumps("x" * 70_000) + "}",
        " " * 500_000,
    ],
    ids=["5000 [", "5000 {", "200 levels", "nul", "nul key", "surrogate", "70 KB", "spaces"],
)
@pytest.mark.parametrize("action", [["add", "https://example.com/h"], ["update", "1"]])
def test_metadata_nested_or_unstorable_is_one_line_naming_the_option(
    cli: Cli, action: list[str], metadata: str
) -> None:
    before = cli.tables()
    code, out, err = cli("endpoints", *action, "--metadata", metadata)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"outbox endpoints {action[0]}: metadata: ")
    assert err.endswith(" (--metadata)\n"), err
    assert cli.tables() == before


@pytest.mark.parametrize(
    "argv",
    [
        ["endpoints", "add", "https://example.com/h", "--description", "d\udcff"],
        ["endpoints", "update", "1", "--description", "\udcff"],
        ["endpoints", "disable", "1", "--reason", "r\udcff"],
        ["endpoints", "update", "1", "--filter", "a == '\udcff'"],
        ["endpoints", "add", "https://example.com/h", "--event-type", "\udcff"],
        ["endpoints", "update", "1", "--url", "https://example.com/\udcff"],
        ["endpoints", "rotate-secret", "1", "--secret", "whsec_\udcff"],
    ],
    ids=lambda argv: " ".join(argv[:2] + [a for a in argv if a.startswith("--")]),
)
def test_arguments_that_are_not_utf8_are_one_line_naming_the_option(
    cli: Cli, argv: list[str]
) -> None:
    """Bytes in ``argv`` that are not UTF-8 reach Python as lone surrogates: the
    library refuses them before the database does (psycopg could not encode them)."""
    option = next(a for a in argv if a.startswith("--"))
    before = cli.tables()
    code, out, err = cli(*argv)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and option in err, err
    assert cli.tables() == before


def test_an_event_key_that_is_not_utf8_is_one_line(cli: Cli) -> None:
    assert assert_clean(cli, ["replay", "--endpoint=1", "--event", "evt\udcff"]) == 2


@pytest.mark.slow
def test_a_process_given_bytes_that_are_not_utf8_exits_2_in_one_line(database_url: str) -> None:
    """The same through a real ``argv`` and environment (no traceback, no database
    error): a description, and the variable that lists the secrets keys."""
    for argv, env in (
        ([b"endpoints", b"add", b"https://example.com/h", b"--description", b"d\xff"], {}),
        ([b"endpoints", b"list"], {b"OUTBOX_SECRETS_KEY": b"\xff"}),
    ):
        result = subprocess.run(
            [os.fsencode(sys.executable), b"-m", b"dispatchers.cli", *argv,
             b"--database-url", database_url.encode()],
            cwd=ROOT, env={**os.environb, **env}, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=60,
        )  # fmt: skip
        err = result.stderr.decode(errors="replace")
        assert (result.returncode, result.stdout) == (2, b""), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert ("--description" if env == {} else "OUTBOX_SECRETS_KEY") in err, err
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.endpoints").fetchone() == (0,)


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ("\udcff", "key 1 is not valid base64"),
        ("not base64!", "key 1 is not valid base64"),
        ("QUJD", "key 1 must be 32 bytes of base64, not 3"),
        (base64.b64encode(b"k" * 32).decode() + ",QUJD", "key 2 must be 32 bytes of base64, not 3"),
        (",,", "holds no key"),
    ],
)
def test_a_secrets_key_variable_that_holds_no_keys_is_one_line_naming_it(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, keys: str, problem: str
) -> None:
    monkeypatch.setenv("OUTBOX_SECRETS_KEY", keys)
    code, out, err = cli("endpoints", "list")
    assert (code, out) == (2, "")
    assert err == f"outbox endpoints list: OUTBOX_SECRETS_KEY: {problem}\n"


def test_empty_entries_between_keys_are_passed_over(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = base64.b64encode(b"1" * 32).decode(), base64.b64encode(b"2" * 32).decode()
    monkeypatch.setenv("OUTBOX_SECRETS_KEY", f",{first},, ,{second},")
    code, _, err = cli("endpoints", "rekey", "--json")
    assert code == 0, err


# -- files: a regular file, bounded, in its encoding -------------------------------------


def hostile_file(kind: str, tmp_path: Path, limit: int) -> str:
    """A path that is not a small text file, of ``kind``."""
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "directory":
        return str(tmp_path)
    if kind == "missing":
        return str(tmp_path / "missing")
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a read would wait for ever
    elif kind == "oversized":
        path.write_bytes(b"A" * (limit + 1))
    elif kind == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    return str(path)


FILE_PROBLEMS = {
    "dev-zero": "is not a regular file",
    "directory": "is not a regular file",
    "fifo": "is not a regular file",
    "missing": "cannot read",
    "oversized": "is larger than",
    "binary": "is not ASCII text",
}
ADD = ["endpoints", "add", "https://example.com/h"]
FILE_OPTIONS = {
    "--secrets-key-file": (["endpoints", "list"], MAX_KEY_FILE),
    "--ca-bundle": (ADD, MAX_PEM),
    "--client-cert": ([*ADD, "--client-key={empty}"], MAX_PEM),
    "--client-key": ([*ADD, "--client-cert={empty}"], MAX_PEM),
}
"""Each option that names a file, the command line it is given in (with a file
its option needs beside it, ``{empty}``: read fine), and its limit in bytes."""


@pytest.mark.parametrize("kind", list(FILE_PROBLEMS))
@pytest.mark.parametrize("option", list(FILE_OPTIONS))
@pytest.mark.slow
def test_a_file_option_refuses_what_is_not_a_small_text_file_in_one_line(
    tmp_path: Path, option: str, kind: str
) -> None:
    """Each in a process of its own, with a timeout: a FIFO or /dev/zero read
    would hang or fill memory. Nothing is read from the database: the files are
    read first (its URL names no server)."""
    argv, limit = FILE_OPTIONS[option]
    path = hostile_file(kind, tmp_path, limit)
    (tmp_path / "empty").touch()
    argv = [part.replace("{empty}", str(tmp_path / "empty")) for part in argv]
    result = subprocess.run(
        [sys.executable, "-m", "dispatchers.cli", *argv, f"{option}={path}",
         "--database-url", "postgresql://outbox@127.0.0.1:1/none"],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f": {option}: " in result.stderr and FILE_PROBLEMS[kind] in result.stderr
