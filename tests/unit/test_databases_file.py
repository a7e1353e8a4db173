"""The list of databases ``outbox dispatch`` serves: the ``--databases`` file, the
repeated ``--database-url``, and their labels. Every mistake is refused before
anything connects, naming the entry and the field, and no error or label shows a
password. Pure: no database."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchers.cli import main
from dispatchers.runtime.databases import Served, default_label, parse_databases, served
from outbox.errors import ConfigurationError

SECRET = "s3cr3t-pw"
URL = f"postgresql://dispatcher:{SECRET}@eu.db.internal:6432/app?sslmode=require"


def test_labels_name_host_port_database_and_a_schema_not_the_default() -> None:
    assert default_label(URL, "outbox") == "eu.db.internal:6432/app"
    assert default_label(URL, "billing") == "eu.db.internal:6432/app/billing"
    assert default_label("postgresql:///app?host=/run/pg", "outbox") == "localhost:5432/app"


def test_a_file_lists_urls_with_optional_schemas_and_labels() -> None:
    text = f"""
[[database]]
url = "{URL}"
label = "eu"

[[database]]
url = "{URL}"
schema = "billing"

[[database]]
url = "postgres://us.db.internal/app"
"""
    entries = parse_databases(text, source="f.toml", schema="outbox")
    assert [(e.schema, e.label) for e in entries] == [
        ("outbox", "eu"),
        ("billing", "eu.db.internal:6432/app/billing"),
        ("outbox", "us.db.internal:5432/app"),
    ]
    assert entries[2].url.startswith("postgresql://")  # as libpq takes it
    assert SECRET not in repr(entries)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[database", "f.toml: not TOML"),
        ("", "f.toml: no [[database]] entry"),
        ("database = 1", "f.toml: no [[database]] entry"),
        ('[[databases]]\nurl = "postgresql:///a"', "f.toml: unknown table or key 'databases'"),
        ("[[database]]\nlabel = 'eu'", "f.toml: [[database]] 1 (eu): url: required"),
        ("[[database]]\nurl = 5", "f.toml: [[database]] 1: url: required"),
        (
            f'[[database]]\nurl = "{URL}"\n[[database]]\nurl = "mysql://{SECRET}@h/a"',
            "f.toml: [[database]] 2: url: the scheme must be postgresql:// or postgres://",
        ),
        (
            f'[[database]]\nurl = "{URL}"\nshema = "x"',
            "f.toml: [[database]] 1: unknown field 'shema'; the fields are url, schema, label",
        ),
        (
            f'[[database]]\nurl = "{URL}"\nschema = "pg_x"\nlabel = "eu"',
            "f.toml: [[database]] 1 (eu): schema: 'pg_x' is PostgreSQL's own",
        ),
        (f'[[database]]\nurl = "{URL}"\nschema = 3', "f.toml: [[database]] 1: schema: must be"),
        (f'[[database]]\nurl = "{URL}"\nlabel = ""', "f.toml: [[database]] 1: label: must be"),
        (
            f'[[database]]\nurl = "{URL}"\nlabel = "a\\nb"',
            "f.toml: [[database]] 1: label: must be printable",
        ),
        (
            f'[[database]]\nurl = "postgresql://u:{SECRET}@[::1/db"',
            "f.toml: [[database]] 1: url: is not a PostgreSQL URL libpq can parse",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry_and_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_databases(text, source="f.toml")
    assert str(raised.value).startswith(message), str(raised.value)
    assert SECRET not in str(raised.value)


def test_the_same_database_and_schema_twice_is_refused() -> None:
    twice = f'[[database]]\nurl = "{URL}"\n'
    with pytest.raises(ConfigurationError, match=r"database 2 \(eu.db.internal:6432/app\): label"):
        served([URL], "outbox", parse_databases(twice, source="f.toml"))
    one = served([URL], "outbox", [Served(URL, "outbox", "other")])
    assert [db.label for db in one] == ["eu.db.internal:6432/app", "other"]


def test_the_command_refuses_a_bad_file_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "databases.toml"
    # nowhere.invalid never resolves: a connection attempt would fail otherwise
    path.write_text(
        f'[[database]]\nurl = "postgresql://u:{SECRET}@nowhere.invalid/a"\n'
        '[[database]]\nurl = "postgresql://nowhere.invalid/b"\nlabel = "b"\ncolour = "red"\n'
    )
    assert main(["dispatch", "--databases", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--databases {path}: [[database]] 2 (b): unknown field 'colour'" in err
    assert SECRET not in err


def test_the_command_refuses_fewer_request_slots_than_databases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    urls = [f"postgresql://nowhere.invalid/{name}" for name in "abc"]
    args = ["dispatch", "--concurrency", "2"]
    for url in urls:
        args += ["--database-url", url]
    assert main(args) == 2
    assert "concurrency: 2 is fewer than the 3 databases" in capsys.readouterr().err


def test_a_missing_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dispatch", "--databases", str(tmp_path / "none.toml")]) == 2
    assert "--databases: cannot read" in capsys.readouterr().err
