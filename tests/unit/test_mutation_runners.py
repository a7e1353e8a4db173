"""The mutation runners still fit the tree, checked without running a mutant: each
SQL mutant's text is once in its statement, each test a set names exists, each
equivalent Python mutant is still made by mutmut. A moved test file or a changed
statement fails here, in the normal suite, rather than in the next mutation run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.mutation import python_mutants, scores, sql_mutants


def test_every_sql_mutant_applies_and_every_test_its_sets_name_exists(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sql_mutants.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    "reference",
    [
        "test_no_such_file.py",
        "test_fences.py::test_no_such_test",
        "test_alerts.py",  # in tests/runtime and in tests/library: which one?
    ],
)
def test_the_sql_check_fails_on_a_test_reference_that_names_no_test(
    reference: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sql_mutants.SETS, "fences", (*sql_mutants.FENCES, reference))
    assert sql_mutants.main(["--check"]) == 1
    assert reference.partition("::")[0] in capsys.readouterr().out


@pytest.mark.parametrize(
    ("old", "section"),
    [
        ("AND m.lease_owner = %(owner)s AND m.lease_owner = %(owner)s", "renew"),  # nowhere
        ("AND m.lease_owner = %(owner)s", "no_such_statement"),
        ("m.id", "renew"),  # more than once
    ],
)
def test_the_sql_check_fails_on_a_mutant_that_is_not_once_in_its_statement(
    old: str, section: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = replace(sql_mutants.MUTANTS["renew_owner"], old=old, section=section)
    monkeypatch.setitem(sql_mutants.MUTANTS, "renew_owner", stale)
    assert sql_mutants.main(["--check", "renew_owner"]) == 1
    assert "renew_owner" in capsys.readouterr().out


def test_a_mutant_of_a_function_applies_only_in_the_migration_that_defines_it_last() -> None:
    mutant = sql_mutants.MUTANTS["function_publish_no_lock"]
    assert sql_mutants.stale_mutants([mutant]) == []
    # 0024 defines publish too, with the same lock, and 0028 defines it again
    lock = "PERFORM _lock_ordering_key(publish.ordering_key);"
    earlier = replace(mutant, file="sql/migrations/0024_tenants.sql", old=lock, new="")
    (problem,) = sql_mutants.stale_mutants([earlier])
    assert "0028_alerts.sql defines publish again" in problem


def test_a_mutant_that_changes_only_comments_does_not_apply() -> None:
    mutant = sql_mutants.MUTANTS["ordered_no_lock"]
    comment = replace(mutant, old="-- back. Without an ordering key", new="-- back. Without a key")
    assert sql_mutants.stale_mutants([comment]) != []


@pytest.mark.slow
def test_every_python_equivalent_is_a_mutant_mutmut_makes_now(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert python_mutants.main(["--check"]) == 0, capsys.readouterr().out


def test_an_equivalent_is_named_by_its_change_not_by_its_number() -> None:
    keys = python_mutants.mutants_of("digest")
    key = python_mutants._key(
        "outbox._digest.x__field",
        '-return len(data).to_bytes(8, "big") + data',
        "+return len(data).to_bytes(8, ) + data",
    )
    assert key in python_mutants.EQUIVALENT
    assert list(keys.values()).count(key) == 1


def test_the_python_check_fails_on_an_equivalent_no_mutant_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = python_mutants._key("outbox._digest.x__field", "-return data", "+return None")
    monkeypatch.setitem(python_mutants.EQUIVALENT, gone, "a line the function no longer has")
    assert python_mutants.main(["--check"]) == 1
    assert "-return data" in capsys.readouterr().out


def test_a_score_replaces_the_row_of_its_set_and_keeps_the_others(tmp_path: Path) -> None:
    file = tmp_path / "scores.md"
    scores.record("sql", "fences", "1/2 killed", "python -m x", file=file)
    scores.record("python", "outcome", "3/3 killed", "python -m y", file=file)
    scores.record("sql", "fences", "2/2 killed", "python -m x", file=file)
    rows = [line for line in file.read_text().splitlines() if line.startswith("| sql")]
    assert len(rows) == 1 and "2/2 killed" in rows[0]
    assert "3/3 killed" in file.read_text()
