"""Every runnable example runs; the deployment files keep their safety margins."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from standardwebhooks.webhooks import Webhook

from outbox.endpoints import Endpoints
from outbox.secrets import generate_secret
from tests.receiver import Receiver
from tests.receiver_example import WEBHOOK_ID, check_receiver_example

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GRACE = 10  # the --grace both deployment files pass


def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def drain_to_loopback(database_url: str) -> None:
    """``outbox dispatch --drain`` on ``database_url``, the test's receivers on
    127.0.0.1 allowed; it must exit 0."""
    drain = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatchers.cli",
            "dispatch",
            "--database-url",
            database_url,
            "--drain",
            "--allow-private-networks",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert drain.returncode == 0, drain.stderr


@pytest.mark.slow
def test_order_examples_write_the_order_and_its_message_together(database_url: str) -> None:
    with Receiver() as payments:
        sync_url, async_url = payments.url + "/sync", payments.url + "/async"
        out = run_example(
            "orders_sync.py", "--database-url", database_url, "--payments-url", sync_url
        )
        assert "order 1 committed with its outbox message" in out
        out = run_example(
            "orders_async.py", "--database-url", database_url, "--payments-url", async_url
        )
        assert "order 1 committed with its outbox message" in out
        drain_to_loopback(database_url)
    received = sorted((r.path, r.headers["idempotency-key"]) for r in payments.requests)
    assert received == [
        ("/async", '"shop-async-order-1-charge"'),
        ("/sync", '"shop-order-1-charge"'),
    ]
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT url, body FROM outbox.delivered ORDER BY url").fetchall()
    assert [url for url, _ in rows] == [async_url, sync_url]
    assert b'"amount":990' in rows[0][1] and b'"amount":4200' in rows[1][1]


@pytest.mark.slow
def test_order_examples_run_on_the_embedded_server_with_no_url(embedded_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OUTBOX_DATABASE_URL", "DATABASE_URL")}
    env["OUTBOX_EMBEDDED_DIR"] = str(embedded_home / "pg")

    def outbox(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dispatchers.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
            cwd=embedded_home,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    url = outbox("db", "url")  # kept running, so this test can look at it afterwards
    try:
        outbox("migrate")
        payments = "http://127.0.0.1:9/charges"  # never sent: nothing dispatches here
        for example in ("orders_sync.py", "orders_async.py"):
            out = run_example(example, "--payments-url", payments, env=env)
            assert "order 1 committed with its outbox message" in out
        with psycopg.connect(url) as conn:
            keys = conn.execute(
                "SELECT idempotency_key FROM outbox.messages ORDER BY id"
            ).fetchall()
        # two orders, two charges: the examples' keys cannot collide
        assert keys == [("shop-order-1-charge",), ("shop-async-order-1-charge",)]
    finally:
        outbox("db", "stop", "--force")


def test_webhook_receiver_example_verifies_and_applies_once(database_url: str) -> None:
    secret = generate_secret()
    check_receiver_example(
        [
            *(sys.executable, str(EXAMPLES / "webhook_receiver.py")),
            *("--database-url", database_url, "--secret", secret, "--port", "0"),
        ],
        secret,
    )
    with psycopg.connect(database_url) as conn:
        applied = conn.execute("SELECT webhook_id FROM crm_inbox.events").fetchall()
    assert applied == [(WEBHOOK_ID,)]


def test_systemd_unit_is_hardened_and_outlasts_the_grace_period() -> None:
    unit = (EXAMPLES / "deploy" / "outbox-dispatch.service").read_text()
    for directive in (
        "User=outbox",
        "NoNewPrivileges=true",
        "ProtectSystem=strict",
        "KillSignal=SIGTERM",
        f"--grace {GRACE}",
    ):
        assert directive in unit
    match = re.search(r"^TimeoutStopSec=(\d+)s$", unit, re.MULTILINE)
    assert match and int(match.group(1)) > GRACE + 5


def test_container_and_kubernetes_files_run_unprivileged_with_a_long_enough_grace() -> None:
    container = (EXAMPLES / "deploy" / "Containerfile").read_text()
    assert re.search(r"^USER 10001$", container, re.MULTILINE)
    assert f'"--grace", "{GRACE}"' in container
    k8s = (EXAMPLES / "deploy" / "kubernetes.yaml").read_text()
    match = re.search(r"terminationGracePeriodSeconds: (\d+)", k8s)
    assert match and int(match.group(1)) > GRACE + 5
    for needle in (
        "runAsNonRoot: true",
        "allowPrivilegeEscalation: false",
        "path: /healthz",
        "path: /livez",
        "readOnlyRootFilesystem: true",
    ):
        assert needle in k8s


@pytest.mark.slow
def test_django_example_publishes_order_created_with_the_order(database_url: str) -> None:
    with Receiver() as partner:
        out = run_example(
            "django_orders.py", "--database-url", database_url, "--webhook-url", partner.url
        )
        assert "order 1 created; order.created published in the same transaction" in out
        drain_to_loopback(database_url)
    (request,) = partner.requests
    assert request.headers["webhook-id"].startswith("order-1-created:")
    event = json.loads(request.body)
    assert event["type"] == "order.created"
    assert event["data"] == {"order_id": 1, "total_cents": 4200}


@pytest.mark.slow
def test_every_example_explains_itself_in_whole_sentences() -> None:
    for example in sorted(EXAMPLES.glob("*.py")):
        out = run_example(example.name, "--help")
        description = " ".join(out.split("\n\n")[1].split())
        assert description.endswith("."), f"{example.name}: {description!r}"
        # every option says what it is for: on its line, or on the next, indented
        lines = out.split("options:", 1)[1].splitlines()[1:]
        for line, after in zip(lines, [*lines[1:], ""], strict=True):
            if line.startswith("  -") and not re.search(r"\S {2,}\S", line):
                assert after.startswith(" " * 8) and after.strip(), f"{example.name}: {line}"


NODE = EXAMPLES / "node"


def node_missing() -> str | None:
    """Why the Node.js example cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE / "node_modules" / "pg").is_dir():
        return "the example's packages are not installed: npm ci --prefix examples/node"
    return None


def libpq_env(database_url: str) -> dict[str, str]:
    """The environment that points node-postgres (and psql) at ``database_url``."""
    info = conninfo_to_dict(database_url)
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    env |= {names[k]: str(v) for k, v in info.items() if k in names and v}
    if info.get("password"):
        env["PGPASSWORD"] = str(info["password"])
    return env


def test_node_producer_example_publishes_with_its_order_and_is_delivered_verified(
    database_url: str,
) -> None:
    missing = node_missing()
    if missing is not None:
        pytest.skip(missing)
    with Receiver() as hooks:
        with psycopg.connect(database_url) as conn:
            endpoint = Endpoints().add(conn, url=hooks.url + "/hooks", event_types=["order.*"])
        done = subprocess.run(
            ["node", str(NODE / "orders.mjs")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=libpq_env(database_url),
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("order 1 committed with 1 webhook message(s)"), done.stdout
        drain_to_loopback(database_url)
    (request,) = hooks.requests
    event = Webhook(endpoint.secrets[0].secret).verify(request.body, request.headers)
    assert event["type"] == "order.created"
    assert event["data"] == {"order_id": 1, "customer": "ada", "total_cents": 4200}
    assert request.headers["webhook-id"] == f"shop-order-1-created:{endpoint.id}"
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT customer FROM shop.orders").fetchall() == [("ada",)]


@pytest.mark.slow
def test_trigger_example_publishes_each_new_order_once(database_url: str) -> None:
    with Receiver() as hooks:
        with psycopg.connect(database_url) as conn:
            endpoint = Endpoints().add(conn, url=hooks.url + "/hooks", event_types=["order.*"])
            conn.execute((EXAMPLES / "trigger_publish.sql").read_text().encode())
        with psycopg.connect(database_url) as conn:
            conn.execute("INSERT INTO shop.orders (customer, total_cents) VALUES ('ada', 4200)")
            conn.execute("INSERT INTO shop.orders (customer, total_cents) VALUES ('bob', 990)")
        with psycopg.connect(database_url) as conn:  # rolled back: no order, no event
            conn.execute("INSERT INTO shop.orders (customer, total_cents) VALUES ('eve', 1)")
            conn.rollback()
        drain_to_loopback(database_url)
    events = [
        Webhook(endpoint.secrets[0].secret).verify(r.body, r.headers)["data"]
        for r in hooks.requests
    ]
    assert sorted(events, key=lambda e: e["order_id"]) == [
        {"order_id": 1, "customer": "ada", "total_cents": 4200},
        {"order_id": 2, "customer": "bob", "total_cents": 990},
    ]
