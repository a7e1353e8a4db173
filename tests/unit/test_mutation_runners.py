"""The mutation runners still fit the tree, checked without running a mutant: each
SQL mutant's text is once in its statement, each test a set names exists, each
equivalent Python mutant is still made by mutmut. A moved test file or a changed
statement fails here, in the normal suite, rather than in the next mutation run."""

from __future__ import annotations

import threading
from collections.abc import Callable
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
    page = tmp_path / "testing.md"
    page.write_text(f"# Testing\n\n{scores.render([])}\n\nThe rest of the page.\n")

    def score(runner: str, name: str, killed: int) -> scores.Score:
        return scores.Score(runner, name, 3, killed, 1, f"python -m {runner} {name}")

    scores.record(score("sql", "fences", 1), page=page)
    scores.record(score("python", "outcome", 2), page=page)
    scores.record(score("sql", "fences", 2), page=page)
    assert [(s.runner, s.name, s.killed) for s in scores.read(page)] == [
        ("sql", "fences", 2),
        ("python", "outcome", 2),
    ]
    text = page.read_text()
    assert text.startswith("# Testing\n\n") and text.endswith("\n\nThe rest of the page.\n")
    assert "| sql | fences | 3 | 2 | 1 | 100.0% |" in text


def test_the_scores_in_the_testing_page_cover_every_set_and_module_each_at_full_marks() -> None:
    recorded = scores.read()
    assert scores.block() == scores.render(recorded), "the table is written by scores.record"
    assert sorted((s.runner, s.name) for s in recorded) == sorted(
        [("sql", name) for name in sql_mutants.SETS]
        + [("python", name) for name in python_mutants.MODULES]
    ), "run the set or module missing from the table, or drop the row of one that is gone"
    short = [s.row() for s in recorded if s.not_killed]
    assert not short, "mutants neither killed nor equivalent:\n" + "\n".join(short)


def test_sql_mutants_run_side_by_side_each_in_a_copy_no_other_is_using(tmp_path: Path) -> None:
    copies = [tmp_path / "a", tmp_path / "b"]
    busy: set[Path] = set()
    both = threading.Barrier(2, timeout=10)
    lock = threading.Lock()

    def job(i: int) -> Callable[[Path], int]:
        def run(work: Path) -> int:
            with lock:
                assert work not in busy
                busy.add(work)
            if i < 2:
                both.wait()  # the first two run at once, in the two copies
            with lock:
                busy.remove(work)
            return i * i

        return run

    done = dict(sql_mutants._in_turn([job(i) for i in range(6)], copies))
    assert done == {i: i * i for i in range(6)}
