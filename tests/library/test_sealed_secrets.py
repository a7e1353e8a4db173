"""Signing secrets sealed at rest, against a real database and a real receiver: what
a superuser reads, deliveries the reference library verifies, a rekey while a
dispatcher delivers, and a dispatcher without the key."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from dispatchers.cli import main
from dispatchers.runtime.log import EventLog
from outbox import Outbox
from outbox.endpoints import Endpoints
from outbox.sealing import KEY_BYTES, Keyring, SecretKeyMissing, generate_key, key_id
from outbox.secrets import SECRET_PREFIX, parse_secret
from tests.dispatching import fast_config, running, wait_until
from tests.receiver import Receiver

KEY_A, KEY_B = generate_key(), generate_key()
ID_A, ID_B = (key_id(base64.b64decode(k)) for k in (KEY_A, KEY_B))


Cli = Callable[..., tuple[int, str, str]]
"""``outbox ...`` run in-process: its exit status, stdout and stderr."""


def ring(*keys: str) -> Keyring:
    return Keyring([base64.b64decode(k) for k in keys])


class Db:
    """The test's database, each call on a connection of its own (committed)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def add(self, url: str, keyring: Keyring | None = None) -> tuple[int, str]:
        with psycopg.connect(self.url) as conn:
            endpoint = Endpoints(keyring=keyring).add(conn, url=url)
        return endpoint.id, endpoint.secrets[0].secret

    def publish(self, n: int) -> list[int]:
        with psycopg.connect(self.url) as conn:
            return Outbox().publish(conn, "order.paid", {"n": n})

    def reseal(self, keyring: Keyring, limit: int) -> int:
        with psycopg.connect(self.url) as conn:
            return Endpoints(keyring=keyring).reseal(conn, limit=limit)

    def delivered(self) -> int:
        return int(self.query("SELECT count(*) FROM outbox.delivered")[0][0])


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def cli(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    """``outbox ...`` in-process against the test's database, without a key in the
    environment."""
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


def key_file(tmp_path: Path, *keys: str) -> str:
    path = tmp_path / "keys"
    path.write_text("\n".join(keys) + "\n")
    return str(path)


def test_a_superuser_reads_no_secret_in_the_table(cli: Cli, db: Db, tmp_path: Path) -> None:
    keys = key_file(tmp_path, KEY_A)
    code, out, err = cli(
        "endpoints", "add", "https://example.com/hooks", "--json", "--secrets-key-file", keys
    )
    assert code == 0, err
    added = json.loads(out)
    code, out, err = cli(
        "endpoints", "rotate-secret", str(added["id"]), "--json", "--secrets-key-file", keys
    )
    assert code == 0, err
    secrets = [added["secret"], json.loads(out)["secret"]]

    rows = db.query("SELECT s::text, s.key_id FROM outbox.endpoint_secrets AS s ORDER BY id")
    assert [key for _, key in rows] == [ID_A, ID_A]
    table = " ".join(text for text, _ in rows)
    for secret in secrets:
        encoded = secret[len(SECRET_PREFIX) :]
        for form in (
            secret,
            encoded,
            encoded.rstrip("="),
            parse_secret(secret).hex(),
            base64.b64encode(secret.encode()).decode(),
        ):
            assert form not in table
    assert KEY_A not in table

    # with the key the operator reads them back; without it, the error names the key
    code, out, err = cli(
        "endpoints",
        "show",
        str(added["id"]),
        "--show-secrets",
        "--json",
        "--secrets-key-file",
        keys,
    )
    assert code == 0, err
    assert [s["secret"] for s in json.loads(out)["secrets"]] == secrets[::-1]
    code, out, err = cli("endpoints", "show", str(added["id"]))
    assert code == 2
    assert ID_A in err and len(err.strip().splitlines()) == 1


async def test_deliveries_signed_from_sealed_secrets_verify_with_the_reference(
    db: Db, receiver: Receiver
) -> None:
    keyring = ring(KEY_A)
    endpoint_id, old = db.add(receiver.url + "/hooks", keyring)
    with psycopg.connect(db.url) as conn:
        new = Endpoints(keyring=keyring).rotate_secret(conn, endpoint_id).secrets[0].secret
    for n in range(20):
        db.publish(n)
    async with running(db, fast_config(keyring=keyring)) as dispatcher:
        await wait_until(lambda: db.delivered() == 20, seconds=30)
    assert len(receiver.requests) == 20
    for request in receiver.requests:
        Webhook(new).verify(request.body, request.headers)
        Webhook(old).verify(request.body, request.headers)
    # two sealed secrets, each opened once for twenty messages
    assert dispatcher._opener.secrets.decrypted == 2


@pytest.mark.slow
async def test_rekey_from_plain_text_then_to_a_new_key_while_a_dispatcher_delivers(
    cli: Cli, db: Db, receiver: Receiver, tmp_path: Path
) -> None:
    endpoints = [db.add(f"{receiver.url}/e{i}") for i in range(4)]
    secrets = {f"/e{i}": secret for i, (_, secret) in enumerate(endpoints)}
    published = 0

    def publish() -> None:
        nonlocal published
        db.publish(published)
        published += 1

    async with running(db, fast_config(keyring=ring(KEY_A, KEY_B))):
        publish()
        # plain text to key A, one secret per transaction, publishing in between
        while db.reseal(ring(KEY_A), limit=1):
            publish()
        assert {k for (k,) in db.query("SELECT key_id FROM outbox.endpoint_secrets")} == {ID_A}
        publish()
        # key A to key B by the command, the dispatcher delivering meanwhile
        keys = key_file(tmp_path, KEY_B, KEY_A)
        rekey = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dispatchers.cli",
            "endpoints",
            "rekey",
            "--batch",
            "1",
            "--json",
            "--secrets-key-file",
            keys,
            "--database-url",
            db.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        finished = asyncio.create_task(rekey.communicate())
        while not finished.done():
            publish()
            await asyncio.sleep(0.05)
        stdout, stderr = await finished
        code, out, err = rekey.returncode, stdout.decode(), stderr.decode()
        assert code == 0, err
        assert json.loads(out) == {"key_id": ID_B, "sealed": 4, "remaining": 0}
        assert f"sealed 4 of 4 secret(s) under key {ID_B}" in err
        publish()
        await wait_until(lambda: db.delivered() == 4 * published, seconds=30)

    assert {k for (k,) in db.query("SELECT key_id FROM outbox.endpoint_secrets")} == {ID_B}
    assert len(receiver.requests) == 4 * published
    for request in receiver.requests:
        Webhook(secrets[request.path]).verify(request.body, request.headers)
    # idempotent: nothing left to seal
    code, out, err = cli("endpoints", "rekey", "--json", "--secrets-key-file", keys)
    assert code == 0, err
    assert json.loads(out) == {"key_id": ID_B, "sealed": 0, "remaining": 0}


def test_a_dispatcher_without_the_key_refuses_to_start_naming_it(
    cli: Cli, db: Db, tmp_path: Path
) -> None:
    db.add("https://example.com/hooks", ring(KEY_A))
    for given in ((), ("--secrets-key-file", key_file(tmp_path, KEY_B))):
        code, _, err = cli("dispatch", "--drain", *given)
        assert code == 1
        assert len(err.strip().splitlines()) == 1
        assert ID_A in err and "does not hold" in err
    code, _, err = cli("dispatch", "--drain", "--secrets-key-file", key_file(tmp_path, KEY_A))
    assert code == 0, err


async def test_a_secret_under_a_key_the_dispatcher_lacks_is_withheld_never_sent_unsigned(
    db: Db, receiver: Receiver
) -> None:
    endpoint_id, _ = db.add(receiver.url, ring(KEY_A))
    stream = io.StringIO()
    log = EventLog(stream=stream, format="json")
    async with running(db, fast_config(keyring=ring(KEY_A)), log=log):
        # an operator seals under a key this dispatcher was not given
        assert db.reseal(ring(KEY_B, KEY_A), limit=10) == 1
        (message_id,) = db.publish(1)

        def withheld() -> bool:
            events = [json.loads(line) for line in stream.getvalue().splitlines()]
            return any(e["event"] == "released" for e in events) and db.query(
                "SELECT state, attempts, lease_owner IS NULL, available_at > now()"
                " FROM outbox.messages WHERE id = %s",
                message_id,
            ) == [("ready", 0, True, True)]

        await wait_until(withheld)
    assert receiver.requests == []
    (event,) = [
        e
        for e in map(json.loads, stream.getvalue().splitlines())
        if e["event"] == "secrets_unavailable"
    ]
    assert event["message_id"] == message_id and event["endpoint_id"] == endpoint_id
    assert ID_B in event["error"] and event["level"] == "error"


def test_a_bad_key_is_a_usage_error_naming_where_it_came_from(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = base64.b64encode(b"k" * (KEY_BYTES - 1)).decode()
    for argv, named in [
        (("--secrets-key-file", str(tmp_path / "absent")), "--secrets-key-file"),
        (("--secrets-key-file", key_file(tmp_path, "not base64!")), "--secrets-key-file"),
        (("--secrets-key-file", key_file(tmp_path, short)), "--secrets-key-file"),
    ]:
        code, _, err = cli("endpoints", "list", *argv)
        assert code == 2, err
        assert named in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("OUTBOX_SECRETS_KEY", short)
    code, _, err = cli("status")
    assert code == 2
    assert "OUTBOX_SECRETS_KEY: key 1 must be 32 bytes" in err


def test_status_warns_of_plain_text_secrets_until_they_are_sealed(
    cli: Cli, db: Db, tmp_path: Path
) -> None:
    db.add("https://example.com/hooks")
    code, out, err = cli("status", "--json")
    assert code == 0
    snapshot = json.loads(out)
    assert snapshot["secrets"] == {"plain_text": 1, "sealed": {}}
    assert "stored in plain text" in err and snapshot["warnings"]
    keys = key_file(tmp_path, KEY_A)
    assert cli("endpoints", "rekey", "--secrets-key-file", keys)[0] == 0
    code, out, err = cli("status", "--json", "--secrets-key-file", keys)
    assert code == 0
    snapshot = json.loads(out)
    assert snapshot["secrets"] == {"plain_text": 0, "sealed": {ID_A: 1}}
    assert snapshot["warnings"] == [] and "warning" not in err
    # given a new first key, status says what is left to rekey
    code, out, err = cli("status", "--secrets-key-file", key_file(tmp_path, KEY_B, KEY_A))
    assert code == 0
    assert f"sealed under keys other than the first ({ID_B})" in err


def test_endpoints_without_a_key_read_sealed_secrets_as_an_error_naming_the_key(db: Db) -> None:
    endpoint_id, _ = db.add("https://example.com/hooks", ring(KEY_A))
    with psycopg.connect(db.url) as conn, pytest.raises(SecretKeyMissing) as missing:
        Endpoints().require(conn, endpoint_id)
    assert missing.value.key_id == ID_A
