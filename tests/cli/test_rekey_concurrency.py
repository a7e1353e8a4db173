"""``outbox endpoints rekey`` running while another transaction changes the same
secrets: a rotation of one endpoint's secret, or another rekey. Each interleaving
is made with an open transaction holding its row locks; where one side must
wait, its wait is seen in ``pg_stat_activity`` before the other side goes on.

Whatever the order, no secret is lost or left unsealed once the rekey has been
run again, a rekey that met secrets held by another transaction says so (exit
1, "run it again"), and a dispatcher holding only the newest key signs with every
secret in force.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from dispatchers.cli import main
from outbox import Outbox
from outbox.endpoints import Endpoints
from outbox.sealing import Keyring, Sealed, generate_key, key_id
from tests.database import Db
from tests.dispatching import drain, fast_config
from tests.receiver import Receiver

KEY_A, KEY_B = generate_key(), generate_key()
ID_A, ID_B = (key_id(base64.b64decode(k)) for k in (KEY_A, KEY_B))

Cli = Callable[..., tuple[int, str, str]]


def ring(*keys: str) -> Keyring:
    return Keyring([base64.b64decode(k) for k in keys])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def rekey(
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    """``outbox endpoints rekey`` in-process, with the key file "B then A"."""
    monkeypatch.delenv("OUTBOX_SECRETS_KEY", raising=False)
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY_B}\n{KEY_A}\n")
    where = ["--secrets-key-file", str(keys), "--database-url", database_url]

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(["endpoints", "rekey", *argv, *where])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


def add_endpoints(url: str, receiver: Receiver, count: int) -> dict[int, str]:
    """``count`` endpoints, their secrets sealed under key A; their first secrets."""
    with psycopg.connect(url) as conn:
        added = [
            Endpoints(keyring=ring(KEY_A)).add(conn, url=f"{receiver.url}/e{i}")
            for i in range(count)
        ]
    return {ep.id: ep.secrets[0].secret for ep in added}


def stored(url: str) -> list[tuple[int, str, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT endpoint_id, secret, key_id FROM outbox.endpoint_secrets ORDER BY id"
        ).fetchall()
    return [(int(e), str(s), k) for e, s, k in rows]


def opened_under_b_alone(url: str) -> dict[int, set[str]]:
    """Every stored secret, each sealed under key B and opened with it alone: a
    secret left unsealed or under another key fails here."""
    newest = ring(KEY_B)
    secrets: dict[int, set[str]] = {}
    for endpoint_id, text, kid in stored(url):
        assert kid == ID_B, f"a secret of endpoint {endpoint_id} is under {kid}, not {ID_B}"
        plain = newest.open(Sealed(text, kid), endpoint_id=endpoint_id)
        secrets.setdefault(endpoint_id, set()).add(plain)
    return secrets


async def assert_signed_with_each(
    url: str, receiver: Receiver, secrets: dict[int, set[str]]
) -> None:
    """A dispatcher holding key B alone delivers an event to every endpoint, each
    request carrying a signature that each of its endpoint's secrets verifies."""
    with psycopg.connect(url) as conn:
        Outbox().publish(conn, "order.paid", {"n": 1})
    await drain(Db(url), fast_config(keyring=ring(KEY_B)))
    assert len(receiver.requests) == len(secrets)
    paths = {f"/e{i}": endpoint_id for i, endpoint_id in enumerate(sorted(secrets))}
    for request in receiver.requests:
        for secret in secrets[paths[request.path]]:
            Webhook(secret).verify(request.body, request.headers)


def wait_until_waiting_on_a_lock(url: str, pid: int, seconds: float = 10.0) -> None:
    """Return once backend ``pid`` waits on a lock; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"backend {pid} never waited on a lock (last: {row})")
            conn.execute("SELECT pg_sleep(0.01)")  # one poll per 10 ms, on the server


async def test_a_rekey_beside_an_open_rotation_leaves_its_secrets_and_says_run_it_again(
    database_url: str, receiver: Receiver, rekey: Cli
) -> None:
    first = add_endpoints(database_url, receiver, 2)
    rotated, other = sorted(first)
    new_secret = "whsec_" + base64.b64encode(b"r" * 32).decode()
    # an operator still on the old key file rotates one endpoint's secret, and has
    # not committed: the endpoint's current secret row is locked
    with psycopg.connect(database_url) as rotation:
        Endpoints(keyring=ring(KEY_A)).rotate_secret(
            rotation, rotated, secret=new_secret, overlap=timedelta(hours=1)
        )
        code, out, err = rekey()
        assert code == 1, err
        assert f"sealed 1 secret(s) under key {ID_B}" in out
        assert "1 remain (changed meanwhile): run it again" in out
        rows = {e: k for e, _, k in stored(database_url)}  # committed state
        assert rows == {rotated: ID_A, other: ID_B}
    # the rotation committed: its new secret (under A) and the old one remain
    assert [(e, k) for e, _, k in stored(database_url)] == [
        (rotated, ID_A),
        (other, ID_B),
        (rotated, ID_A),
    ]
    code, out, err = rekey("--json")
    assert code == 0, err
    assert json.loads(out) == {"key_id": ID_B, "sealed": 2, "remaining": 0}

    secrets = opened_under_b_alone(database_url)
    assert secrets == {rotated: {first[rotated], new_secret}, other: {first[other]}}
    await assert_signed_with_each(database_url, receiver, secrets)


async def test_a_rotation_that_waits_on_a_rekey_batch_keeps_the_resealed_secret(
    database_url: str, receiver: Receiver, rekey: Cli
) -> None:
    first = add_endpoints(database_url, receiver, 2)
    rotated, other = sorted(first)
    new_secret = "whsec_" + base64.b64encode(b"w" * 32).decode()
    failures: list[BaseException] = []

    def rotate(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        try:
            with conn:  # commits
                Endpoints(keyring=ring(KEY_B, KEY_A)).rotate_secret(
                    conn, rotated, secret=new_secret, overlap=timedelta(hours=1)
                )
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    with psycopg.connect(database_url) as batch:
        # a rekey's batch, its transaction open: both secrets locked, resealed
        assert Endpoints(keyring=ring(KEY_B, KEY_A)).reseal(batch, limit=10) == 2
        rotation = psycopg.connect(database_url)
        pid = rotation.info.backend_pid
        thread = threading.Thread(target=rotate, args=(rotation,))
        thread.start()
        try:
            wait_until_waiting_on_a_lock(database_url, pid)
        except BaseException:
            batch.rollback()
            thread.join(10)
            raise
        # the rotation waits for the batch's row lock on the secret it retires
    # the batch committed, then the rotation went on from the resealed row
    thread.join(10)
    assert not thread.is_alive()
    assert failures == []

    code, out, err = rekey("--json")
    assert code == 0, err
    assert json.loads(out) == {"key_id": ID_B, "sealed": 0, "remaining": 0}
    secrets = opened_under_b_alone(database_url)
    assert secrets == {rotated: {first[rotated], new_secret}, other: {first[other]}}
    await assert_signed_with_each(database_url, receiver, secrets)


@pytest.mark.parametrize("ends", ["commit", "rollback"])
async def test_two_rekeys_at_once_skip_each_others_batch_and_the_rerun_finishes(
    database_url: str, receiver: Receiver, rekey: Cli, ends: str
) -> None:
    first = add_endpoints(database_url, receiver, 3)
    held = min(first)
    with psycopg.connect(database_url) as batch:
        # one rekey's batch of one secret, its transaction open
        assert Endpoints(keyring=ring(KEY_B, KEY_A)).reseal(batch, limit=1) == 1
        # the other rekey seals what it is not held off, and says what remains
        code, out, err = rekey("--json")
        assert code == 1, err
        assert json.loads(out) == {"key_id": ID_B, "sealed": 2, "remaining": 1}
        assert {e: k for e, _, k in stored(database_url)}[held] == ID_A
        getattr(batch, ends)()
    code, out, err = rekey("--json")
    assert code == 0, err
    assert json.loads(out) == {
        "key_id": ID_B,
        "sealed": 0 if ends == "commit" else 1,
        "remaining": 0,
    }
    secrets = opened_under_b_alone(database_url)
    assert secrets == {endpoint_id: {secret} for endpoint_id, secret in first.items()}
    await assert_signed_with_each(database_url, receiver, secrets)
