"""``outbox endpoints add`` and ``update`` with credentials: each option stores
what it says, and bad input exits 2 naming the option or field, with nothing
written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main

Cli = Callable[..., tuple[int, str, str]]

URL = "https://example.com/hooks"


@pytest.fixture
def cli(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.delenv("OUTBOX_SECRETS_KEY", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([*argv, "--database-url", database_url])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def stored(database_url: str) -> Callable[[], list[tuple[Any, ...]]]:
    """Every endpoint's credential columns, by id (the stored value plain: no key)."""

    def read() -> list[tuple[Any, ...]]:
        with psycopg.connect(database_url) as conn:
            return conn.execute(
                "SELECT auth::jsonb, auth_scheme, auth_header_names, basic_username,"
                " oauth2_token_url, oauth2_client_id, oauth2_scope, oauth2_audience"
                " FROM outbox.endpoints ORDER BY id"
            ).fetchall()

    return read


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.slow
def test_each_option_stores_its_credential(
    cli: Cli, stored: Callable[[], list[tuple[Any, ...]]], tmp_path: Path
) -> None:
    code, out, err = cli(
        "endpoints", "add", URL, "--header", "X-Api-Key: k1", "--header", "X-Team:a b",
        "--basic-auth", "alice:pa:ss", "--json",
    )  # fmt: skip
    assert code == 0, err
    endpoint_id = str(json.loads(out)["id"])
    assert stored() == [
        (
            {"headers": {"X-Api-Key": "k1", "X-Team": "a b"},
             "basic": {"username": "alice", "password": "pa:ss"}},
            "basic", ["X-Api-Key", "X-Team"], "alice", None, None, None, None,
        )
    ]  # fmt: skip

    basic = write(tmp_path, "basic", "bob:s3cret\n")
    assert cli("endpoints", "update", endpoint_id, "--basic-auth-file", basic)[0] == 0
    assert stored()[0][0]["basic"] == {"username": "bob", "password": "s3cret"}

    token = write(tmp_path, "token", "tok-1\r\n")
    code, _, err = cli(
        "endpoints", "update", endpoint_id, "--bearer-token-file", token, "--no-basic-auth"
    )
    assert code == 0, err
    assert stored()[0][:4] == (
        {"headers": {"X-Api-Key": "k1", "X-Team": "a b"}, "bearer": "tok-1"},
        "bearer",
        ["X-Api-Key", "X-Team"],
        None,
    )

    secret = write(tmp_path, "secret", "cs-1\n")
    code, _, err = cli(
        "endpoints", "update", endpoint_id, "--no-bearer-token", "--no-headers",
        "--oauth2-token-url", "https://auth.example.com/token", "--oauth2-client-id", "c1",
        "--oauth2-client-secret-file", secret, "--oauth2-scope", "a b", "--oauth2-audience", "api",
    )  # fmt: skip
    assert code == 0, err
    oauth2 = {
        "token_url": "https://auth.example.com/token",
        "client_id": "c1",
        "client_secret": "cs-1",
        "scope": "a b",
        "audience": "api",
    }
    assert stored() == [
        (
            {"headers": {}, "oauth2": oauth2}, "oauth2", [], None,
            "https://auth.example.com/token", "c1", "a b", "api",
        )
    ]  # fmt: skip
    code, out, err = cli("endpoints", "show", endpoint_id)
    assert code == 0 and "OAuth2 client credentials, client c1" in out and "cs-1" not in out

    assert cli("endpoints", "update", endpoint_id, "--no-oauth2")[0] == 0
    assert stored() == [(None, None, [], None, None, None, None, None)]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--header", "X-Api-Key"), "--header"),
        (("--header", ": v"), "--header"),
        (("--header", "X-A: 1", "--header", "x-a: 2"), "--header"),
        (("--header", "Idempotency-Key: k"), "headers[Idempotency-Key]"),
        (("--header", "traceparent: 00-x"), "headers[traceparent]"),
        (("--header", "Bad Name: v"), "headers[Bad Name]"),
        (("--header", "Authorization: x", "--basic-auth", "u:p"), "headers[Authorization]"),
        (("--basic-auth", "nocolon"), "--basic-auth"),
        (("--basic-auth", ":p"), "--basic-auth"),
        (("--basic-auth-file", "{missing}"), "--basic-auth-file"),
        (("--basic-auth-file", "{control}"), "control characters (--basic-auth-file)"),
        (("--basic-auth", "u:p", "--basic-auth-file", "{empty}"), "--basic-auth-file"),
        (("--bearer-token-file", "{missing}"), "--bearer-token-file"),
        (("--bearer-token-file", "{empty}"), "--bearer-token-file"),
        (("--bearer-token-file", "{spaced}"), "--bearer-token-file"),
        (("--basic-auth", "u:p", "--bearer-token-file", "{token}"), "--bearer-token-file"),
        (("--oauth2-token-url", "https://a.example/t"), "--oauth2-client-id"),
        (("--oauth2-scope", "s"), "--oauth2-scope"),
        (
            ("--oauth2-token-url", "ftp://a.example/t", "--oauth2-client-id", "c",
             "--oauth2-client-secret-file", "{token}"),
            "oauth2.token_url",
        ),
        (
            ("--oauth2-token-url", "https://a.example/t", "--oauth2-client-id", "c",
             "--oauth2-client-secret-file", "{missing}"),
            "--oauth2-client-secret-file",
        ),
    ],
)  # fmt: skip
def test_bad_input_exits_2_naming_it_and_writes_nothing(
    cli: Cli,
    stored: Callable[[], list[tuple[Any, ...]]],
    tmp_path: Path,
    argv: tuple[str, ...],
    named: str,
) -> None:
    files = {
        "missing": str(tmp_path / "missing"),
        "empty": write(tmp_path, "empty", "\n"),
        "spaced": write(tmp_path, "spaced", "two words\n"),
        "token": write(tmp_path, "token", "tok\n"),
        "control": write(tmp_path, "control", "a\x01b:p\n"),
    }
    given = [a.format(**files) for a in argv]
    code, _, err = cli("endpoints", "add", URL, *given)
    assert code == 2, err
    assert named in err and len(err.strip().splitlines()) == 1
    assert stored() == []
    code, out, _ = cli("endpoints", "add", URL, "--header", "X-Keep: 1", "--json")
    assert code == 0
    code, _, err = cli("endpoints", "update", str(json.loads(out)["id"]), *given)
    assert code == 2, err
    assert named in err
    assert [row[2] for row in stored()] == [["X-Keep"]]


def test_update_refuses_setting_and_removing_one_credential_together(
    cli: Cli, tmp_path: Path
) -> None:
    token = write(tmp_path, "token", "tok\n")
    for argv, named in [
        (("--header", "X-A: 1", "--no-headers"), "--no-headers"),
        (("--basic-auth", "u:p", "--no-basic-auth"), "--no-basic-auth"),
        (("--bearer-token-file", token, "--no-bearer-token"), "--no-bearer-token"),
    ]:
        code, _, err = cli("endpoints", "update", "1", *argv)
        assert code == 2 and named in err and "not both" in err


def test_every_credential_option_is_described_in_help(cli: Cli) -> None:
    for action in ("add", "update"):
        code, out, _ = cli("endpoints", action, "--help")
        assert code == 0
        for option in (
            "--header", "--basic-auth", "--basic-auth-file", "--bearer-token-file",
            "--oauth2-token-url", "--oauth2-client-id", "--oauth2-client-secret-file",
            "--oauth2-scope", "--oauth2-audience",
        ):  # fmt: skip
            assert option in out
    assert "--no-headers" in out and "--no-basic-auth" in out and "--no-oauth2" in out
