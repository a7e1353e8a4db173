"""Egress: deliveries through a forward proxy, an endpoint's CA bundle and client
certificate, against real PostgreSQL, a proxy and TLS receivers on loopback.

The proxy listens on 127.0.0.2 and the receivers on 127.0.0.1; the SSRF guard
stays on, with only 127.0.0.1/32 allowed: the proxy's own address is never
checked, the destinations always are.
"""

from __future__ import annotations

import asyncio
import io
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trustme

from dispatchers.delivery.proxy import Proxy
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog, NullLog
from outbox import Outbox
from outbox.endpoints import Endpoint, Endpoints
from outbox.sealing import Keyring, generate_key, parse_keys
from tests.cli.test_cli import Cli
from tests.database import Db
from tests.dispatching import fast_config
from tests.forward_proxy import ForwardProxy
from tests.receiver import Receiver

CLIENTS = ["aiohttp", "httpx"]
GUARDED = {"allow_private_networks": False, "allow_networks": ("127.0.0.1/32",)}
"""The guard on, the receivers' address allowed, the proxy's (127.0.0.2) not."""


@pytest.fixture(scope="module")
def server_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def client_ca() -> trustme.CA:
    return trustme.CA()


def pem(blob: trustme.Blob) -> str:
    return blob.bytes().decode()


def client_pair(ca: trustme.CA) -> tuple[str, str]:
    """A client certificate issued by ``ca`` and its key, as PEM."""
    issued = ca.issue_cert("dispatcher.example")
    return "".join(pem(b) for b in issued.cert_chain_pems), pem(issued.private_key_pem)


def tls_receiver(server_ca: trustme.CA, client_ca: trustme.CA | None = None) -> Receiver:
    """A receiver on https://127.0.0.1:port, requiring a client certificate issued by
    ``client_ca`` when given (a handshake without one never reaches the handler)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ca.issue_cert("127.0.0.1").configure_cert(context)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        client_ca.configure_trust(context)
    receiver = Receiver()
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    return receiver


@pytest.fixture
def https_receiver(server_ca: trustme.CA) -> Iterator[Receiver]:
    with tls_receiver(server_ca) as receiver:
        yield receiver


@pytest.fixture
def mtls_receiver(server_ca: trustme.CA, client_ca: trustme.CA) -> Iterator[Receiver]:
    with tls_receiver(server_ca, client_ca) as receiver:
        yield receiver


def https(receiver: Receiver) -> str:
    return receiver.url.replace("http://", "https://") + "/hook"


def add_endpoint(db: Db, url: str, keyring: Keyring | None = None, **tls: str) -> Endpoint:
    with psycopg.connect(db.url) as conn:
        return Endpoints(keyring=keyring).add(conn, url=url, **tls)


def publish(db: Db, event_type: str = "order.created") -> list[int]:
    with psycopg.connect(db.url) as conn:
        return Outbox().publish(conn, event_type, {"n": 1})


def outcomes(db: Db) -> dict[int, tuple[str, str | None]]:
    """Each webhook message's endpoint, with the state and last error of its message."""
    rows = db.query(
        "SELECT endpoint_id, state, last_error FROM outbox.messages WHERE endpoint_id IS NOT NULL"
        " UNION ALL SELECT endpoint_id, 'delivered', NULL FROM outbox.delivered"
        " WHERE endpoint_id IS NOT NULL"
    )
    return {endpoint: (state, error) for endpoint, state, error in rows}


async def drain(db: Db, config: DispatcherConfig, log: EventLog | None = None) -> None:
    dispatcher = Dispatcher(db.url, config, log=log or NullLog())
    async with asyncio.timeout(30):
        await dispatcher.run(drain=True)


# -- a forward proxy for every delivery ------------------------------------------------


@pytest.mark.parametrize("http_client", CLIENTS)
@pytest.mark.slow
async def test_deliveries_reach_http_and_https_destinations_through_the_proxy(
    database_url: str,
    receiver: Receiver,
    https_receiver: Receiver,
    server_ca: trustme.CA,
    http_client: str,
) -> None:
    db = Db(database_url)
    db.enqueue("plain-1", receiver.url + "/plain")
    endpoint = add_endpoint(db, https(https_receiver), ca_bundle=pem(server_ca.cert_pem))
    publish(db)
    stream = io.StringIO()
    async with ForwardProxy(credentials=("outbox", "s3cret")) as proxy:
        host_port = proxy.url.removeprefix("http://")
        config = fast_config(
            GUARDED, http_client=http_client, proxy=Proxy.parse(f"http://outbox:s3cret@{host_port}")
        )
        await drain(db, config, EventLog(stream=stream, format="json", level="debug"))

    assert [r.path for r in receiver.requests] == ["/plain"]
    assert [r.path for r in https_receiver.requests] == ["/hook"]
    assert outcomes(db) == {endpoint.id: ("delivered", None)}
    tls_port = https_receiver.url.rsplit(":", 1)[1]
    asked = {(f.method, f.target) for f in proxy.forwarded}
    assert asked == {("POST", receiver.url + "/plain"), ("CONNECT", f"127.0.0.1:{tls_port}")}
    assert {f.authorization for f in proxy.forwarded} == {"Basic b3V0Ym94OnMzY3JldA=="}
    # the credentials reach the proxy, never the log (which names the proxy, masked)
    log = stream.getvalue()
    assert "s3cret" not in log and "b3V0Ym94OnMzY3JldA" not in log
    (started,) = [e for e in map(json.loads, log.splitlines()) if e["event"] == "started"]
    assert started["proxy"] == f"http://***@{host_port}"


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_through_the_proxy_the_guard_still_refuses_private_destinations(
    database_url: str, receiver: Receiver, http_client: str
) -> None:
    db = Db(database_url)
    refused = db.enqueue("private-1", "http://10.255.255.1:8080/hook", max_attempts=1)
    loopback = db.enqueue("loopback-1", "http://127.0.0.2:9/hook", max_attempts=1)
    db.enqueue("allowed-1", receiver.url + "/allowed")
    async with ForwardProxy() as proxy:
        config = fast_config(GUARDED, http_client=http_client, proxy=Proxy.parse(proxy.url))
        await drain(db, config)

    # held unsent, their attempt refunded (they used to go dead at once)
    held = dict(
        db.query(
            "SELECT id, last_error FROM outbox.messages WHERE state = 'ready' AND attempts = 0"
        )
    )
    assert set(held) == {refused, loopback}
    assert all("refusing to connect" in error for error in held.values())
    assert db.query("SELECT count(*) FROM outbox.messages WHERE state = 'dead'") == [(0,)]
    assert [r.path for r in receiver.requests] == ["/allowed"]
    assert [f.target for f in proxy.forwarded] == [receiver.url + "/allowed"]


# -- a CA bundle per endpoint ----------------------------------------------------------


async def test_an_endpoint_with_a_ca_bundle_delivers_and_one_without_fails_verification(
    database_url: str, https_receiver: Receiver, server_ca: trustme.CA
) -> None:
    db = Db(database_url)
    trusting = add_endpoint(db, https(https_receiver), ca_bundle=pem(server_ca.cert_pem))
    default = add_endpoint(db, https(https_receiver))
    publish(db)
    await drain(db, fast_config())

    found = outcomes(db)
    assert found[trusting.id] == ("delivered", None)
    state, error = found[default.id]  # retried later, or dead
    assert state != "delivered" and "CERTIFICATE_VERIFY_FAILED" in (error or "")
    assert len(https_receiver.requests) == 1


# -- mutual TLS ------------------------------------------------------------------------


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_an_endpoint_presents_its_client_certificate_sealed_at_rest(
    database_url: str,
    mtls_receiver: Receiver,
    server_ca: trustme.CA,
    client_ca: trustme.CA,
    http_client: str,
) -> None:
    db = Db(database_url)
    keyring = Keyring(parse_keys(generate_key(), "key"))
    bundle = pem(server_ca.cert_pem)
    cert, key = client_pair(client_ca)
    with_cert = add_endpoint(
        db, https(mtls_receiver), keyring, ca_bundle=bundle, client_cert=cert, client_key=key
    )
    without = add_endpoint(db, https(mtls_receiver), keyring, ca_bundle=bundle)
    publish(db)
    await drain(db, fast_config(http_client=http_client, keyring=keyring))

    found = outcomes(db)
    assert found[with_cert.id] == ("delivered", None)
    assert found[without.id][0] != "delivered"
    assert len(mtls_receiver.requests) == 1


def test_a_client_key_is_sealed_in_the_table(database_url: str, client_ca: trustme.CA) -> None:
    db = Db(database_url)
    keyring = Keyring(parse_keys(generate_key(), "key"))
    cert, key = client_pair(client_ca)
    endpoint = add_endpoint(
        db, "https://partner.example/hook", keyring, client_cert=cert, client_key=key
    )
    ((stored, key_id),) = db.query("SELECT client_key, client_key_id FROM outbox.endpoints")
    body = "".join(key.splitlines()[1:-1])
    assert key_id == keyring.current
    assert "PRIVATE KEY" not in stored and body[:40] not in stored
    assert endpoint.client_key is not None and endpoint.client_key.text == stored


# -- the command line ------------------------------------------------------------------


def test_endpoint_tls_options_are_checked_before_anything_is_written(
    database_url: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    client_ca: trustme.CA,
    server_ca: trustme.CA,
) -> None:
    cli = Cli(database_url, capsys)
    cert, key = client_pair(client_ca)
    _, other_key = client_pair(client_ca)
    files: dict[str, Any] = {"cert": cert, "key": key, "other": other_key, "ca": ""}
    files["ca"] = pem(server_ca.cert_pem)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    url = "https://partner.example/hook"

    code, _, err = cli(
        "endpoints", "add", url,
        "--client-cert", str(tmp_path / "cert"), "--client-key", str(tmp_path / "other"),
    )  # fmt: skip
    assert code == 2 and err.startswith("outbox endpoints add: --client-key: ")
    code, _, err = cli("endpoints", "add", url, "--client-cert", str(tmp_path / "cert"))
    assert code == 2 and "--client-key: must be given" in err
    code, _, err = cli("endpoints", "add", url, "--ca-bundle", str(tmp_path / "key"))
    assert code == 2 and "--ca-bundle: holds a private key" in err
    assert cli.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]

    added = cli.json(
        "endpoints", "add", url, "--ca-bundle", str(tmp_path / "ca"),
        "--client-cert", str(tmp_path / "cert"), "--client-key", str(tmp_path / "key"),
    )  # fmt: skip
    assert added["client_key"] == {"key_id": None}
    assert len(added["ca_bundle_sha256"]) == 64
    code, _, _ = cli("endpoints", "update", str(added["id"]), "--no-client-cert")
    assert code == 0
    assert cli.query("SELECT client_cert, client_key FROM outbox.endpoints") == [(None, None)]


def test_a_plain_text_client_key_is_warned_of_until_rekey_seals_it(
    database_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, client_ca: trustme.CA
) -> None:
    cli, db = Cli(database_url, capsys), Db(database_url)
    cert, key = client_pair(client_ca)
    add_endpoint(db, "https://partner.example/hook", client_cert=cert, client_key=key)
    db.query("DELETE FROM outbox.endpoint_secrets RETURNING id")  # the key alone is stored
    code, out, err = cli("status", "--json")
    assert code == 0 and "1 signing secret(s), client key(s) or endpoint credential(s)" in err
    assert json.loads(out)["secrets"] == {"plain_text": 1, "sealed": {}}

    keys = tmp_path / "keys"
    keys.write_text(generate_key())
    current = Keyring(parse_keys(keys.read_text(), "keys")).current
    assert cli("endpoints", "rekey", "--secrets-key-file", str(keys))[0] == 0
    assert db.query("SELECT client_key_id FROM outbox.endpoints") == [(current,)]
    sealed = cli.json("status", "--secrets-key-file", str(keys))["secrets"]
    assert sealed == {"plain_text": 0, "sealed": {current: 1}}
    code, _, err = cli("dispatch", "--drain")  # without the key that opens it
    assert code == 1 and current in err
