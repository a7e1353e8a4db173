"""``outbox tenants`` and ``outbox endpoints add --tenant``, in-process against
the test's database."""

from __future__ import annotations

import psycopg
import pytest

from outbox import Outbox
from tests.cli.test_cli import Cli


@pytest.fixture
def cli(database_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(database_url, capsys)


def test_tenants_are_added_listed_shown_updated_and_deleted(cli: Cli) -> None:
    made = cli.json(
        "tenants", "add", "customer-17", "--name", "Customer 17", "--metadata", '{"plan": "gold"}',
        "--rate-limit", "5", "--retry-schedule", "5s,1m",
    )  # fmt: skip
    assert (made["id"], made["name"], made["metadata"]) == (
        "customer-17",
        "Customer 17",
        {"plan": "gold"},
    )
    assert (made["rate_limit_per_s"], made["burst"], made["retry_schedule"]) == (
        5.0,
        5,
        [5.0, 60.0],
    )
    cli.json("tenants", "add", "customer-18")
    assert [t["id"] for t in cli.json("tenants", "list")] == ["customer-17", "customer-18"]
    code, out, _ = cli("tenants", "show", "customer-17")
    assert code == 0 and "Customer 17" in out and "5s,1m" in out and "5/s, burst 5" in out, out

    endpoint = cli.json("endpoints", "add", "https://example.com/c17", "--tenant", "customer-17")
    assert (endpoint["tenant"], endpoint["rate_limit_per_s"], endpoint["retry_schedule"]) == (
        "customer-17",
        5.0,
        [5.0, 60.0],
    )
    cli.json("endpoints", "add", "https://example.com/operator")
    listed = cli.json("endpoints", "list", "--tenant", "customer-17")
    assert [e["id"] for e in listed] == [endpoint["id"]]
    code, out, _ = cli("endpoints", "list")
    assert code == 0 and "customer-17" in out

    changed = cli.json("tenants", "update", "customer-17", "--name", "Renamed", "--no-rate-limit")
    assert (changed["name"], changed["rate_limit_per_s"], changed["endpoints"]) == (
        "Renamed",
        None,
        1,
    )

    with psycopg.connect(cli.url) as conn:
        (message_id,) = Outbox().publish(conn, "order.created", {"n": 1}, tenant="customer-17")
    deleted = cli.json("tenants", "delete", "customer-17", "--yes")
    assert (deleted["endpoints"], deleted["messages"]) == (1, 1)
    assert cli.query("SELECT state FROM outbox.messages WHERE id = %s", message_id) == [("dead",)]
    assert [t["id"] for t in cli.json("tenants", "list")] == ["customer-18"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["tenants", "add", "has space"], "(ID)"),
        (["tenants", "add", "ok", "--metadata", "[1]"], "(--metadata)"),
        (["tenants", "add", "ok", "--name", "n" * 201], "(--name)"),
        (["tenants", "add", "ok", "--burst", "3"], "(--burst)"),
        (["tenants", "show", "nobody"], "(ID)"),
        (["tenants", "update", "nobody", "--name", "x"], "(ID)"),
        (["tenants", "update", "ok"], "nothing to change"),
        (["endpoints", "add", "https://example.com/x", "--tenant", "nobody"], "(--tenant)"),
        (["endpoints", "add", "https://example.com/x", "--tenant", "a b"], "(--tenant)"),
    ],
)
def test_bad_input_exits_2_naming_the_option_and_writes_nothing(
    cli: Cli, argv: list[str], named: str
) -> None:
    code, out, err = cli(*argv)
    assert code == 2, (out, err)
    assert named in err, err
    assert cli.query("SELECT count(*) FROM outbox.tenants") == [(0,)]
    assert cli.query("SELECT count(*) FROM outbox.endpoints") == [(0,)]


def test_delete_without_yes_and_without_a_terminal_refuses(cli: Cli) -> None:
    cli.json("tenants", "add", "customer-17")
    code, _, err = cli("tenants", "delete", "customer-17")
    assert code == 2 and "without --yes" in err
    assert cli.query("SELECT external_id FROM outbox.tenants") == [("customer-17",)]
