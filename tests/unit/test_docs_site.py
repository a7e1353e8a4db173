"""The documentation site builds, warnings being errors, with every page it promises.

``mkdocs build --strict`` from ``mkdocs.yml`` into a temporary directory, offline:
a broken link or anchor, a page missing from the navigation's files, a docstring
mkdocstrings cannot render or a reference the hook cannot generate fails the
build. The pages generated from the code (the command line, the settings, the API,
the metrics, the exit statuses) are then checked for what they must hold.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchers.cli import build_parser
from dispatchers.cli._exit import ExitCode
from dispatchers.runtime.config import DispatcherConfig
from tests.docs import ROOT

pytestmark = pytest.mark.timeout(300)

PAGES = (
    "index.md",
    "tutorials/quickstart.md",
    "tutorials/first-webhook.md",
    "tutorials/receiver.md",
    "how-to/install.md",
    "how-to/dispatcher.md",
    "how-to/django.md",
    "how-to/sql-producers.md",
    "how-to/filtering.md",
    "how-to/retry-schedules.md",
    "how-to/rate-limits.md",
    "how-to/tenants.md",
    "how-to/endpoint-credentials.md",
    "how-to/secrets-at-rest.md",
    "how-to/egress.md",
    "how-to/tracing.md",
    "how-to/scaling.md",
    "how-to/operating.md",
    "how-to/alerts.md",
    "how-to/retention.md",
    "how-to/dashboard.md",
    "how-to/management-api.md",
    "reference/cli.md",
    "reference/configuration.md",
    "reference/api.md",
    "reference/python.md",
    "reference/messages.md",
    "reference/exit-statuses.md",
    "reference/metrics.md",
    "reference/postgresql.md",
    "explanation/delivery-contract.md",
    "explanation/claims-and-fairness.md",
    "explanation/ssrf.md",
    "explanation/key-generations.md",
    "explanation/performance.md",
    "contributing/layout.md",
    "contributing/testing.md",
)
"""Every page the site must have, by its source under ``docs/``."""


def built(site: Path, page: str) -> Path:
    """Where ``mkdocs`` writes ``page`` (directory URLs: ``a/b.md`` is ``a/b/index.html``)."""
    if page == "index.md":
        return site / "index.html"
    return site / page.removesuffix(".md") / "index.html"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    missing = [page for page in PAGES if not built(site, page).is_file()]
    assert missing == []


def test_the_hook_is_not_published(site: Path) -> None:
    assert not (site / "hooks").exists()


def test_the_command_reference_names_every_command_and_option(site: Path) -> None:
    html = built(site, "reference/cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    stack: list[tuple[tuple[str, ...], argparse.ArgumentParser]] = [(("outbox",), parser)]
    while stack:
        path, current = stack.pop()
        assert " ".join(path) in html
        for action in current._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in html, (path, flag)
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                stack += [((*path, name), sub) for name, sub in choices.items()]


def test_the_settings_reference_names_every_field(site: Path) -> None:
    html = built(site, "reference/configuration.md").read_text(encoding="utf-8")
    for name in DispatcherConfig.__dataclass_fields__:
        assert f"<code>{name}</code>" in html, name


def test_the_api_reference_has_every_operation(site: Path) -> None:
    html = built(site, "reference/api.md").read_text(encoding="utf-8")
    for operation in (
        "GET /endpoints",
        "POST /endpoints",
        "GET /messages/{id}",
        "POST /dead/retry",
    ):
        assert f"<code>{operation}</code>" in html, operation


def test_the_exit_status_and_metrics_references_are_generated(site: Path) -> None:
    statuses = built(site, "reference/exit-statuses.md").read_text(encoding="utf-8")
    for member in ExitCode:
        assert f"<code>{member.name}</code>" in statuses, member
    metrics = built(site, "reference/metrics.md").read_text(encoding="utf-8")
    for name in ("outbox_deliveries_total", "outbox_messages_ready", "outbox_database_up"):
        assert name in metrics


def test_the_python_reference_renders_the_public_api(site: Path) -> None:
    html = built(site, "reference/python.md").read_text(encoding="utf-8")
    for name in (
        "outbox.Outbox.enqueue",
        "outbox.Outbox.publish_async",
        "outbox.Endpoints.add",
        "outbox.receiver.verify",
        "outbox.receiver.Inbox.claim",
        "outbox.admin.dead_retry",
        "outbox.errors.OutboxError",
    ):
        assert f'id="{name}"' in html, name
