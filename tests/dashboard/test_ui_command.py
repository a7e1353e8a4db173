"""``outbox ui`` refuses what it cannot use in one line naming the option (exit
status 2), never a traceback: token files that are not small text, addresses
that do not resolve or cannot be listened on. And what it can use, it serves:
bracketed IPv6, a name with the root's dot, sealed secrets with their key."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from dispatchers.cli import main
from outbox.endpoints import Endpoints
from outbox.sealing import Keyring, generate_key
from outbox.secrets import fingerprint
from tests.dashboard import serving
from tests.database import Db

pytestmark = pytest.mark.timeout(90)

NOWHERE = "postgresql://nowhere.invalid/x"


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``outbox ui *argv``; it must exit 2 with one line on stderr, which this
    returns."""
    code = main(["ui", "--database-url", NOWHERE, *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe\x00token\n", "is not UTF-8 text"),
        (b"t" * 5000, "is larger than"),
        (b"tok\x00en\n", "not printable"),
    ],
)
def test_a_token_file_that_is_not_a_small_text_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, problem: str
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    err = _refusal(capsys, "--token-file", str(path))
    assert "--token-file" in err and problem in err


def test_a_token_file_that_is_a_device_is_refused_unread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refusal(capsys, "--token-file", "/dev/zero")
    assert "--token-file" in err and "not a regular file" in err


@pytest.mark.parametrize("host", ["127.0.0.1 ", " localhost", "local host", "nosuch.invalid", ""])
def test_a_host_that_cannot_be_listened_on_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")  # so that only the address is at fault
    err = _refusal(capsys, "--host", host, "--token-file", str(token))
    assert "--host" in err


def test_a_name_that_resolves_beyond_loopback_needs_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_UI_TOKEN", raising=False)
    err = _refusal(capsys, "--host", "0.0.0.0.")
    assert "without a token" in err


def test_a_port_that_is_taken_is_refused_naming_it(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["ui", "--database-url", database_url, "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2 and "--host/--port" in err and "Traceback" not in err, err
    assert err.strip().count("\n") == 0
    assert err.strip().endswith(f"port {port}: Address already in use"), err


@pytest.mark.parametrize("behind", [False, True])
def test_a_schema_not_migrated_is_one_line_before_anything_is_served(
    database_url: str, capsys: pytest.CaptureFixture[str], behind: bool
) -> None:
    if behind:  # migrated by an older version: the latest migration is missing
        Db(database_url).query(
            "DELETE FROM outbox.schema_migrations"
            " WHERE version = (SELECT max(version) FROM outbox.schema_migrations)"
            " RETURNING version"
        )
    schema = "outbox" if behind else "nosuch"
    code = main(["ui", "--database-url", database_url, "--schema", schema, "--port", "0"])
    err = capsys.readouterr().err
    state = "is behind this version of outbox" if behind else "has no outbox tables"
    assert code == 1, err
    assert err == (
        f"outbox ui: schema {schema!r} {state}: run `outbox migrate --schema {schema}` "
        "(or outbox.migrate(url, schema=...)) first\n"
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # our own, on loopback
        body: bytes = response.read()
        return body.decode()


@pytest.mark.parametrize(("host", "shown"), [("[::1]", "[::1]"), ("localhost.", "localhost")])
@pytest.mark.slow
def test_a_bracketed_address_or_a_name_with_the_roots_dot_is_served(
    database_url: str, tmp_path: Path, host: str, shown: str
) -> None:
    if host == "[::1]":
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            pytest.skip("this machine has no IPv6 loopback")
    command = ["ui", "--host", host, "--port", "0", "--database-url", database_url]
    with serving(command, tmp_path / "ui.log") as url:
        assert url.startswith(f"http://{shown}:")
        assert "<h1>Overview</h1>" in _get(url)


@pytest.mark.slow
def test_sealed_secrets_open_with_the_key_the_command_is_given(
    database_url: str, tmp_path: Path
) -> None:
    key = generate_key()
    keyring = Keyring.from_text(key, "test key")
    secret = "whsec_" + "C" * 44
    with Db(database_url).tx() as conn:
        endpoint = Endpoints(keyring=keyring).add(conn, url="https://e.com/", secret=secret).id
    keys = tmp_path / "keys"
    keys.write_text(key + "\n")
    base = ["ui", "--port", "0", "--database-url", database_url]
    with serving([*base, "--secrets-key-file", str(keys)], tmp_path / "file.log") as url:
        from_file = _get(f"{url}endpoints/{endpoint}")
    env = {"OUTBOX_SECRETS_KEY": key}
    with serving(base, tmp_path / "env.log", env=env) as url:
        from_env = _get(f"{url}endpoints")
    with serving(base, tmp_path / "none.log", env={"OUTBOX_SECRETS_KEY": ""}) as url:
        without = _get(f"{url}endpoints/{endpoint}")
    assert fingerprint(secret) in from_file and fingerprint(secret) in from_env
    assert fingerprint(secret) not in without and f"sealed ({keyring.current})" in without
