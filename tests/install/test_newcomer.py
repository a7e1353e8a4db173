"""A newcomer follows the README and the tutorials, literally, from the root of a
fresh clone.

The README's demo, then the tutorials (``docs/tutorials/``: the quickstart, the
first webhook endpoint), their own code blocks taken by the section they stand in
and run as written, in order, in a throwaway directory that holds only what a clone would
(the virtual environment and ``examples/``): no database URL is given, so every
command and program uses the embedded server in ``./.outbox/pg`` there. Shell
blocks run in one shell session (what a block exports, the next one sees), with
the virtual environment on ``PATH`` as the set-up asks; Python snippets run as
files. Each step must exit 0 and do what the text says it does, and each is
timed: ``pytest -m newcomer -s -n 0`` prints the times (in one process, so that the
output reaches the terminal). The README's five-minute example is the quickstart's,
block for block.

The set-up commands (``pip install``, ``pytest``) are what CI runs already. The
only departures from the text: the receiver example's placeholder secret
(``whsec_...``) becomes a real one, and its port 8000 a free one; the commands
the text runs in terminals of their own (the receiver, a dispatcher) run in the
background while the next steps run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox.secrets import generate_secret
from tests import docs
from tests.receiver_example import WEBHOOK_ID, check_receiver_example

pytestmark = [pytest.mark.newcomer, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = "tutorials/quickstart.md"
FIRST_WEBHOOK = "tutorials/first-webhook.md"
STEP_TIMEOUT = 90.0
"""Seconds any one step may take before the test fails (the demo takes about ten)."""


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def block(name: str, heading: str, language: str = "", containing: str = "") -> str:
    """The one block of the section ``heading`` of ``name`` (the README or a page) in
    ``language`` whose text contains ``containing``."""
    found = docs.blocks(name, heading)
    (text,) = [t for lang, t in found if lang == language and containing in t]
    return text


class Newcomer:
    """A shell session at the root of a fresh clone, timing each step."""

    def __init__(self, home: Path) -> None:
        self.home = home
        # what a clone holds: the virtual environment, and the examples
        (home / ".venv").symlink_to(sys.prefix, target_is_directory=True)
        (home / "examples").symlink_to(REPO / "examples")
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OUTBOX_DATABASE_URL", "DATABASE_URL", "OUTBOX_EMBEDDED_DIR")
        }
        self.env["PATH"] = f"{home / '.venv' / 'bin'}{os.pathsep}{self.env['PATH']}"
        self.times: list[tuple[str, float]] = []

    def shell(self, step: str, script: str) -> str:
        """Run ``script`` in bash; keep what it exports for the next steps."""
        saved = self.home / ".newcomer-env"
        done = self._run(step, ["bash", "-e", "-c", f'{script}\nenv -0 > "{saved}"'])
        names = (entry.partition("=") for entry in saved.read_text().split("\0") if entry)
        self.env = {name: value for name, _, value in names}
        return done

    def python(self, step: str, snippet: str) -> str:
        path = self.home / f"{step.replace(' ', '_')}.py"
        path.write_text(snippet, encoding="utf-8")
        return self._run(step, ["python", path.name])

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the step ``name``."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.times.append((name, time.monotonic() - started))

    def _run(self, step: str, argv: list[str]) -> str:
        with self.step(step):
            done = subprocess.run(
                argv,
                cwd=self.home,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT,
                check=False,
            )
        assert done.returncode == 0, f"{step}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    @contextlib.contextmanager
    def background(self, step: str, argv: list[str], *, ready: str) -> Iterator[None]:
        """Run ``argv`` while the block runs (a terminal of its own), once a line of
        its output holds ``ready``; stopped as Ctrl-C would stop it."""
        with self.step(step):
            process = subprocess.Popen(
                argv,
                cwd=self.home,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert process.stdout is not None
            seen: list[str] = []
            deadline = time.monotonic() + STEP_TIMEOUT
            while not any(ready in line for line in seen):
                line = process.stdout.readline()
                assert line and time.monotonic() < deadline, f"{step}: {''.join(seen)}"
                seen.append(line)
        try:
            yield
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()

    def wait_for(self, step: str, where: str) -> None:
        """Wait until the receiver's table holds an event ``where`` describes (SQL)."""
        with self.step(step):
            deadline = time.monotonic() + STEP_TIMEOUT
            while not self.query(f"SELECT 1 FROM crm_inbox.events WHERE {where}"):
                assert time.monotonic() < deadline, f"no event with {where} reached the receiver"
                time.sleep(0.2)

    def wait_until(self, step: str, statement: str, expected: list[tuple[object, ...]]) -> None:
        """Wait until ``statement`` returns ``expected``; fail saying what it returned."""
        with self.step(step):
            deadline = time.monotonic() + STEP_TIMEOUT
            while (found := self.query(statement)) != expected:
                assert time.monotonic() < deadline, f"{statement} returned {found}, not {expected}"
                time.sleep(0.2)

    def query(self, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.env["OUTBOX_DATABASE_URL"]) as conn:
            return conn.execute(statement).fetchall()


@pytest.fixture
def newcomer(embedded_home: Path) -> Iterator[Newcomer]:
    person = Newcomer(embedded_home)
    yield person
    # whatever happened, the server in the throwaway directory stops with it
    env = {k: v for k, v in person.env.items() if k != "OUTBOX_DATABASE_URL"}
    subprocess.run(
        ["outbox", "db", "stop", "--force"],
        cwd=embedded_home,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    print("\nthe README and the tutorials, step by step (seconds):")
    for step, seconds in person.times:
        print(f"  {seconds:6.1f}  {step}")


def test_the_readmes_example_is_the_quickstarts() -> None:
    enqueue = "Enqueue inside your transaction"
    assert docs.blocks(docs.README, enqueue) == docs.blocks(QUICKSTART, enqueue)


def test_the_readme_and_tutorials_run_as_written_on_the_embedded_server(
    newcomer: Newcomer,
) -> None:
    out = newcomer.shell("outbox demo", block(docs.README, "See it work"))
    assert "every invariant held" in out

    enqueue = "Enqueue inside your transaction"
    newcomer.shell("db url, migrate", block(QUICKSTART, enqueue))
    snippet = block(QUICKSTART, enqueue, "python")
    first = newcomer.python("enqueue snippet", snippet)
    # the order and its message, committed together
    assert newcomer.query("SELECT id, total FROM orders") == [(42, 1000)]
    assert newcomer.query("SELECT idempotency_key, url, state FROM outbox.messages") == [
        ("order-42-charge", "https://payments.example.com/charges", "ready")
    ]
    # run again, as the quickstart says it can: the same message, nothing written
    assert newcomer.python("enqueue snippet again", snippet) == first
    assert newcomer.query("SELECT count(*) FROM orders") == [(1,)]
    assert newcomer.query("SELECT count(*) FROM outbox.messages") == [(1,)]

    out = newcomer.shell(
        "examples", block(QUICKSTART, "Run a dispatcher", containing="examples/orders_")
    )
    assert out.count("order 1 committed with its outbox message") == 2
    assert re.search(r"^running +yes$", out, flags=re.M), out  # outbox db status

    receiving = "A first delivery, end to end"
    command = block(FIRST_WEBHOOK, receiving, containing="webhook_receiver")
    secret = generate_secret()
    with newcomer.step("webhook receiver example"):
        check_receiver_example(
            command.replace("whsec_...", secret).replace("--port 8000", "--port 0").split(),
            secret,
            cwd=newcomer.home,
            env=newcomer.env,
        )
    assert newcomer.query("SELECT webhook_id FROM crm_inbox.events") == [(WEBHOOK_ID,)]

    # the first delivery, end to end: endpoint, receiver, dispatcher, test event
    port = str(free_port())
    out = newcomer.shell(
        "endpoint for the receiver",
        block(FIRST_WEBHOOK, receiving, containing="endpoints add").replace("8000", port),
    )
    (walk_secret,) = re.findall(r"signing secret: (whsec_\S+)", out)
    (endpoint_id,) = re.findall(r"created endpoint (\d+)", out)
    receiver = command.replace("whsec_...", walk_secret).replace("8000", port).split()
    dispatcher = block(FIRST_WEBHOOK, receiving, containing="--allow-private-networks").split()
    with (
        newcomer.background("webhook receiver", receiver, ready="listening on"),
        newcomer.background("dispatcher", dispatcher, ready='"event":"started"'),
    ):
        test = block(FIRST_WEBHOOK, receiving, containing="endpoints test")
        test = test.replace("ID", endpoint_id)
        out = newcomer.shell("test event", test)
        assert "sent a test event to endpoint" in out, out
        newcomer.wait_for("first delivery", "type = 'outbox.test'")
        assert newcomer.query(
            "SELECT count(*) FROM crm_inbox.events WHERE type = 'outbox.test'"
        ) == [(1,)]
        # delivered: moved to the history, nothing of it left to send (the
        # outcome is written a moment after the receiver applied the event)
        delivered = "SELECT count(*) FROM outbox.delivered WHERE event_type = 'outbox.test'"
        newcomer.wait_until("first delivery recorded", delivered, [(1,)])
        assert (
            newcomer.query("SELECT id FROM outbox.messages WHERE event_type = 'outbox.test'") == []
        )

        # publish, with the receiver and the dispatcher still running
        publishing = "Publish webhook events"
        snippet = block(FIRST_WEBHOOK, publishing, "python", containing="box, endpoints =")
        newcomer.python("publish snippet", snippet)
        newcomer.python("publish snippet again", snippet)
        assert newcomer.query("SELECT state FROM orders") == [("paid",)]
        endpoints = dict(newcomer.query("SELECT url, id FROM outbox.endpoints"))
        partner = endpoints.pop("https://partner.example.com/hooks")
        assert list(endpoints.values()) == [int(endpoint_id)]
        # to the local receiver, applied once
        paid = f"order-42-paid:{endpoint_id}"
        newcomer.wait_for("order.paid delivered", f"webhook_id = '{paid}'")
        assert newcomer.query(
            "SELECT webhook_id FROM crm_inbox.events WHERE type = 'order.paid' ORDER BY webhook_id"
        ) == [(WEBHOOK_ID,), (paid,)]
    # to the partner's placeholder: not delivered, waiting for a retry
    assert newcomer.query(
        "SELECT idempotency_key FROM outbox.messages WHERE event_type = 'order.paid'"
    ) == [(f"order-42-paid:{partner}",)]

    done = block(FIRST_WEBHOOK, "When you are done", containing="db stop")
    out = newcomer.shell("db stop", done)
    assert out.strip() == "stopped"
    assert "OUTBOX_DATABASE_URL" not in newcomer.env
