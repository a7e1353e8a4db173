"""An endpoint's CA bundle replaces the roots its deliveries trust, on both HTTP
clients: a TLS receiver on 127.0.0.1 whose certificate a test CA issued is
delivered to when the bundle holds that CA, and refused (a verification error,
the message not delivered) when the bundle holds another CA, even while the test
CA is in the process's default trust."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import certifi
import psycopg
import pytest
import trustme

from outbox import Outbox
from outbox.endpoints import Endpoints
from tests.database import Db
from tests.dispatching import drain, fast_config
from tests.receiver import Receiver

CLIENTS = ["aiohttp", "httpx"]


@pytest.fixture(scope="module")
def test_ca() -> trustme.CA:
    """The CA that issued the receiver's certificate."""
    return trustme.CA()


@pytest.fixture(scope="module")
def other_ca() -> trustme.CA:
    """A CA that issued nothing the test meets."""
    return trustme.CA()


@pytest.fixture
def https_receiver(test_ca: trustme.CA) -> Iterator[Receiver]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    test_ca.issue_cert("127.0.0.1").configure_cert(context)
    receiver = Receiver()
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    with receiver:
        yield receiver


@pytest.fixture
def default_roots_trust_test_ca(
    test_ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test CA among the process's default roots: the dispatcher's default
    context reads certifi's bundle (``httpx.create_ssl_context``, trust_env off),
    and OpenSSL's default paths read ``SSL_CERT_FILE``; both name a bundle with it."""
    roots = tmp_path / "roots.pem"
    roots.write_text(Path(certifi.where()).read_text() + pem(test_ca))
    monkeypatch.setattr(certifi, "where", lambda: str(roots))
    monkeypatch.setenv("SSL_CERT_FILE", str(roots))


def pem(ca: trustme.CA) -> str:
    return ca.cert_pem.bytes().decode()


def add(db: Db, receiver: Receiver, path: str, ca_bundle: str | None) -> int:
    url = receiver.url.replace("http://", "https://") + path
    with psycopg.connect(db.url) as conn:
        return Endpoints().add(conn, url=url, ca_bundle=ca_bundle).id


def outcomes(db: Db) -> dict[int, tuple[str, str | None]]:
    """Each endpoint's message: its state and last error."""
    rows = db.query(
        "SELECT endpoint_id, state, last_error FROM outbox.messages"
        " UNION ALL SELECT endpoint_id, 'delivered', NULL FROM outbox.delivered"
    )
    return {endpoint: (state, error) for endpoint, state, error in rows}


def assert_refused_by_verification(found: tuple[str, str | None]) -> None:
    state, error = found
    assert state != "delivered"
    assert "CERTIFICATE_VERIFY_FAILED" in (error or ""), error


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_a_bundle_of_the_issuing_ca_delivers_and_a_bundle_of_another_refuses(
    database_url: str,
    https_receiver: Receiver,
    test_ca: trustme.CA,
    other_ca: trustme.CA,
    http_client: str,
) -> None:
    db = Db(database_url)
    trusting = add(db, https_receiver, "/trusting", pem(test_ca))
    foreign = add(db, https_receiver, "/foreign", pem(other_ca))
    with psycopg.connect(database_url) as conn:
        Outbox().publish(conn, "order.paid", {"n": 1})
    await drain(db, fast_config(http_client=http_client))

    found = outcomes(db)
    assert found[trusting] == ("delivered", None)
    assert_refused_by_verification(found[foreign])
    assert [r.path for r in https_receiver.requests] == ["/trusting"]


@pytest.mark.parametrize("http_client", CLIENTS)
async def test_a_bundle_replaces_the_default_roots_even_when_they_trust_the_issuer(
    database_url: str,
    https_receiver: Receiver,
    test_ca: trustme.CA,
    other_ca: trustme.CA,
    http_client: str,
    default_roots_trust_test_ca: None,
) -> None:
    db = Db(database_url)
    default = add(db, https_receiver, "/default", None)
    foreign = add(db, https_receiver, "/foreign", pem(other_ca))
    with psycopg.connect(database_url) as conn:
        Outbox().publish(conn, "order.paid", {"n": 1})
    await drain(db, fast_config(http_client=http_client))

    found = outcomes(db)
    # the endpoint on the default roots is delivered to: the issuer is trusted there
    assert found[default] == ("delivered", None)
    # the endpoint with its own bundle trusts that bundle alone
    assert_refused_by_verification(found[foreign])
    assert [r.path for r in https_receiver.requests] == ["/default"]
