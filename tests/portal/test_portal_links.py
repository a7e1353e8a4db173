"""Consumer portal links (``outbox.portal`` and ``outbox portal-link``): made for
a tenant, stored as a digest only, bounded in time, found while they work and
not once expired or revoked."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outbox.portal import (
    PATH_PREFIX,
    TOKEN_PREFIX,
    create_link,
    find_link,
    revoke,
    revoke_tenant,
)
from outbox.tenants import Tenants
from tests.cli.test_cli import Cli
from tests.errors import invalid_argument

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(database_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(database_url, capsys)


def _tenant(url: str, external_id: str = "customer-17") -> None:
    with psycopg.connect(url) as conn:
        Tenants().add(conn, external_id, name="Customer 17")


def test_a_link_is_made_for_a_tenant_found_while_it_works_and_stored_as_a_digest(
    database_url: str,
) -> None:
    _tenant(database_url)
    with psycopg.connect(database_url) as conn:
        link = create_link(conn, tenant="customer-17", expires=timedelta(hours=2))
    assert link.token.startswith(TOKEN_PREFIX) and len(link.token) == len(TOKEN_PREFIX) + 43
    assert link.url_path == f"{PATH_PREFIX}{link.token}/"
    assert link.token not in repr(link)
    left = link.expires_at - datetime.now(UTC)
    assert timedelta(minutes=119) < left <= timedelta(hours=2)
    with psycopg.connect(database_url) as conn:
        found = find_link(conn, link.token)
        (stored,) = conn.execute("SELECT token_hash FROM outbox.portal_links").fetchall()
        text = conn.execute("SELECT row_to_json(l)::text FROM outbox.portal_links l").fetchone()
    assert found is not None
    assert (found.id, found.tenant, found.tenant_name) == (link.id, "customer-17", "Customer 17")
    assert bytes(stored[0]) == hashlib.sha256(link.token.encode()).digest()
    assert text is not None and link.token[len(TOKEN_PREFIX) :] not in text[0]


def test_an_unknown_malformed_expired_or_revoked_token_opens_nothing(database_url: str) -> None:
    _tenant(database_url)
    with psycopg.connect(database_url) as conn:
        expired, revoked, kept = (create_link(conn, tenant="customer-17") for _ in range(3))
        conn.execute(
            "UPDATE outbox.portal_links SET created_at = now() - interval '2 hours',"
            " expires_at = now() - interval '1 second' WHERE id = %s",
            (expired.id,),
        )
        assert revoke(conn, revoked.token) is True
        assert revoke(conn, revoked.token) is False  # once
    with psycopg.connect(database_url) as conn:
        assert find_link(conn, expired.token) is None
        assert find_link(conn, revoked.token) is None
        assert find_link(conn, TOKEN_PREFIX + "A" * 43) is None  # never made
        assert find_link(conn, kept.token + "x") is None  # not a token
        assert find_link(conn, kept.token) is not None


def test_revoking_a_tenants_links_ends_them_all_and_deleting_it_deletes_them(
    database_url: str,
) -> None:
    _tenant(database_url)
    _tenant(database_url, "customer-18")
    with psycopg.connect(database_url) as conn:
        mine = [create_link(conn, tenant="customer-17") for _ in range(2)]
        other = create_link(conn, tenant="customer-18")
        assert revoke_tenant(conn, "customer-17") == 2
        assert revoke_tenant(conn, "customer-17") == 0
        assert all(find_link(conn, link.token) is None for link in mine)
        assert find_link(conn, other.token) is not None
        Tenants().delete(conn, "customer-18")
        assert find_link(conn, other.token) is None
        assert conn.execute("SELECT count(*) FROM outbox.portal_links").fetchone() == (2,)
        with invalid_argument("tenant"):
            revoke_tenant(conn, "nobody")
        with invalid_argument("token"):
            revoke(conn, "not-a-token")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tenant": "nobody"}, "tenant"),
        ({"tenant": "customer-17", "expires": timedelta(seconds=59)}, "expires"),
        ({"tenant": "customer-17", "expires": timedelta(days=30, seconds=1)}, "expires"),
        ({"tenant": "customer-17", "expires": 3600}, "expires"),
    ],
)
def test_an_unknown_tenant_or_an_expiry_out_of_bounds_is_refused_and_nothing_written(
    database_url: str, kwargs: dict[str, object], field: str
) -> None:
    _tenant(database_url)
    with psycopg.connect(database_url) as conn:
        with invalid_argument(field):
            create_link(conn, **kwargs)  # type: ignore[arg-type]
        assert conn.execute("SELECT count(*) FROM outbox.portal_links").fetchone() == (0,)


def test_a_malformed_tenant_id_is_refused_naming_tenant(database_url: str) -> None:
    with psycopg.connect(database_url) as conn, pytest.raises(ValueError, match=r"^tenant: "):
        create_link(conn, tenant="no spaces")


def test_the_command_prints_the_url_alone_and_refuses_naming_the_option(cli: Cli) -> None:
    cli("tenants", "add", "customer-17")
    code, out, err = cli(
        "portal-link", "--tenant", "customer-17", "--expires", "2h",
        "--base-url", "https://webhooks.example.com/",
    )  # fmt: skip
    assert code == 0, err
    prefix = f"https://webhooks.example.com{PATH_PREFIX}{TOKEN_PREFIX}"
    assert out.startswith(prefix) and out.endswith("/\n") and out.count("\n") == 1
    token = out.strip().removeprefix("https://webhooks.example.com" + PATH_PREFIX).strip("/")
    ((seconds,),) = cli.query(
        "SELECT extract(epoch FROM expires_at - created_at) FROM outbox.portal_links"
    )
    assert float(seconds) == 7200
    with psycopg.connect(cli.url) as conn:
        assert find_link(conn, token) is not None
    code, out, _ = cli("portal-link", "--tenant", "customer-17")
    assert code == 0 and out.startswith(f"http://127.0.0.1:8321{PATH_PREFIX}{TOKEN_PREFIX}")
    for argv, named in [
        (["--tenant", "nobody"], "(--tenant)"),
        (["--tenant", "customer-17", "--expires", "30s"], "--expires"),
        (["--tenant", "customer-17", "--expires", "31d"], "--expires"),
        (["--tenant", "customer-17", "--base-url", "ftp://x"], "--base-url"),
        (["--tenant", "customer-17", "--base-url", "https://x/?q=1"], "--base-url"),
    ]:
        code, out, err = cli("portal-link", *argv)
        assert (code, out) == (2, ""), argv
        assert named in err, (argv, err)
    assert cli.query("SELECT count(*) FROM outbox.portal_links") == [(2,)]
