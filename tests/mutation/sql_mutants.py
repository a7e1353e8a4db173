"""Hand-made mutants of the SQL the project loads, each against the tests that must notice.

``python -m tests.mutation.sql_mutants [NAME ...] [--set SET]`` (``--list`` names
them): the tree (code, tests and ``sql/``) is copied into a temporary directory,
so that the SQL and the tests that judge it are of one moment while the working
tree changes, and that copy copied once more for each further job (``--jobs``:
by default two per core, as the suite runs, since a run waits on its server and
its receivers much of the time). Then for each mutant, ``--jobs`` at a time and
each in a copy of its own, one statement
of the copy's SQL is changed (a fence removed, a bound moved, a lock dropped or
taken too late), in the library's files (``sql/queries``), the dispatcher's
(``dispatchers/store/sql``) or a function of the migration that defines it
last (``sql/migrations``), and the mutant's set of tests runs in the copy
(stopping at the first failure) on an embedded server of its own, its
statements and its template database's migrations loaded from the copy's files
through the ``tests.mutation.sql_copy`` plugin, which points the loader there.
The working tree is never written.

Killed: a test failed, and it is named. Survived: every test passed, so nothing
pins down what the mutated text does; write the test that does, or, when no
test can tell the mutant apart, say why in its ``equivalent``. Not applicable:
the text to change is no longer in the statement (the SQL changed since the
mutant was written; update it). A mutant that changes only comments (which the
loader strips) is refused as not applicable too. Each set of tests runs once on
the unchanged copy first: a set that fails there fails the run. The score of
each set run whole is written into the table of ``docs/contributing/testing.md``
(:mod:`tests.mutation.scores`; ``--no-record``: not, as CI runs it).

``--check`` runs nothing: it fails when a mutant does not apply, or a test a set
names does not exist (``tests/unit/test_mutation_runners.py`` runs it in the
normal suite). Every run checks so first.

Exits 1 when a mutant not marked equivalent survived, a mutant did not apply, a
test a set names does not exist, or a set failed on the unchanged copy.
"""

from __future__ import annotations

import argparse
import ast
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from outbox._queries import parse
from tests.mutation import scores

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ("outbox", "dispatchers", "sql", "tests", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
PLUGIN = "tests.mutation.sql_copy"
UNUSED_PLUGINS = ("hypothesispytest", "schemathesis")
"""pytest plugins no set's tests use, not loaded: importing them took more than
half of the CPU time a mutant's test run spends before its first test."""
JOBS = 2 * (os.cpu_count() or 1)
ENV = "OUTBOX_SQL_COPY"
LIBRARY_SQL = "sql/queries"
STORE_SQL = "dispatchers/store/sql"
MIGRATIONS = "sql/migrations"
_HEADER = re.compile(r"^-- (?:name|fragment):[ \t]*(\w+)[ \t]*$", re.MULTILINE)
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
_T = TypeVar("_T")

FENCES = (
    "test_fences.py",
    "test_sql_clauses.py",
    "test_claim_and_complete.py::test_lean_completion_is_fenced_by_owner_attempt_and_state",
    "runtime/test_dispatcher.py::test_stale_outcome_of_another_owner_changes_nothing",
    "runtime/test_dispatcher.py::test_stale_outcome_of_the_same_owner_is_fenced_by_attempt",
    "runtime/test_dispatcher.py::test_a_claim_that_commits_after_the_stop_signal_is_released_unsent",
    "test_leases.py",
)
"""What fences the dispatcher's writes: completion, renewal, release, rescue."""

HEALTH = (
    "delivery/test_destination_health.py",
    "test_sql_clauses.py",
    "test_claim_and_complete.py::test_the_short_way_defers_while_a_hold_is_on_its_destination",
)
"""Circuit breakers and holds: open, hold, probe, close, reopen."""

SLOTS = (
    "test_slots.py",
    "test_sql_clauses.py",
    "test_destination_policies.py::test_a_claim_takes_a_slot_of_each_kind_which_release_and_rescue_free",
    "test_destination_policies.py::test_lowering_a_cap_below_the_requests_in_flight_starts_none_until_under_it",
    "test_destination_policies.py::test_no_claim_starts_while_the_cap_is_full_after_it_is_lowered_below_every_free_slot",
    "test_destination_policies.py::test_no_claim_starts_while_the_cap_is_full_after_it_is_set_on_requests_in_flight",
    "test_endpoint_cap.py::test_lowering_the_cap_removes_free_slots",
    "test_claim_and_complete.py::test_claim_with_a_capped_endpoint_takes_the_slots",
    "test_claim_and_complete.py::test_lean_completion_updates_endpoints_and_slots_as_the_general_one_does",
)
"""Concurrency and rate slots: kept in step with the policies, taken, passed on, freed.
(The two-process tests of test_destination_policies are left out: they take a
minute each, and the dispatcher processes they start may import the working
tree rather than the copy.)"""

ORDERING = (
    "test_ordering_keys.py",
    "test_ordering_clause_order.py",
    "test_sql_clauses.py",
    "runtime/test_dispatcher.py::test_ordering_key_delivers_one_at_a_time_in_id_order",
    "runtime/test_dispatcher.py::test_dead_message_does_not_block_its_ordering_key",
    "runtime/test_dispatcher.py::test_claim_respects_ordering_and_batch_limit",
)
"""Ordering keys: the producers' lock, taken before the id is drawn, and the claim's
predicate."""

SETS = {"fences": FENCES, "health": HEALTH, "slots": SLOTS, "ordering": ORDERING}
"""Each set's tests, by the end of their path under ``tests/`` (a file's name, or
as many of its directories as make it one file), optionally with ``::`` and a
test of that file: a file moved to another directory is still found, and
:func:`stale_tests` (``--check``) names a reference that matches no file or
several, or a test that is not in its file."""


@dataclass(frozen=True)
class Mutant:
    """``old`` replaced by ``new`` in the statement or fragment ``section`` of
    ``file`` (a path in the tree: ``sql/queries/...`` for the library's,
    ``dispatchers/store/sql/...`` for the dispatcher's), or in the function
    ``section`` of a migration (``sql/migrations/...``: from its ``CREATE
    FUNCTION`` to the ``$$;`` that ends it, in the migration that defines it
    last), where ``old`` must occur exactly once. Runs of whitespace in ``old``
    match any run of whitespace."""

    name: str
    file: str
    section: str
    old: str
    new: str
    tests: str
    """The name of the set of tests in :data:`SETS`."""
    equivalent: str = ""
    """Why no test can tell the mutant apart, when none can: it survives, and is
    reported with the reason instead of failing the run."""

    def apply(self, text: str) -> str | None:
        """The file's text with the mutation made, or None if ``old`` is not in
        the section exactly once."""
        if _is_migration(self.file):
            bounds = _function_bounds(text, self.section)
        else:
            bounds = _section_bounds(text, self.section)
        if len(bounds) != 1:
            return None
        ((start, end),) = bounds
        pattern = re.compile(r"\s+".join(map(re.escape, self.old.split())))
        found = list(pattern.finditer(text, start, end))
        if len(found) != 1:
            return None
        (match,) = found
        return text[: match.start()] + self.new + text[match.end() :]


def _section_bounds(text: str, name: str) -> list[tuple[int, int]]:
    """Where each statement or fragment ``name`` of a ``.sql`` file's text starts
    (at its header) and ends (at the next header)."""
    starts = [(m.start(), m.group(1)) for m in _HEADER.finditer(text)]
    return [
        (start, starts[i + 1][0] if i + 1 < len(starts) else len(text))
        for i, (start, header) in enumerate(starts)
        if header == name
    ]


def _is_migration(file: str) -> bool:
    return file.startswith(f"{MIGRATIONS}/")


def _function_start(name: str) -> re.Pattern[str]:
    return re.compile(rf"^CREATE (?:OR REPLACE )?FUNCTION (?:\w+\.)?{re.escape(name)}\(", re.M)


def _function_bounds(text: str, name: str) -> list[tuple[int, int]]:
    """Where each definition of the function ``name`` in a migration's text starts
    and ends (after the ``$$;`` that closes its body)."""
    bounds = []
    for match in _function_start(name).finditer(text):
        end = text.find("\n$$;", match.end())
        bounds.append((match.start(), len(text) if end < 0 else end + 4))
    return bounds


def _statements(file: str, text: str) -> object:
    """What of a file's text reaches the server: its statements without comments
    (migrations: the text without ``--`` comments and runs of whitespace)."""
    if _is_migration(file):
        return " ".join(re.sub(r"--[^\n]*", "", text).split())
    return parse(file, text)


def _mutants() -> list[Mutant]:
    out: list[Mutant] = []

    def add(
        name: str, file: str, section: str, old: str, new: str, tests: str, equivalent: str = ""
    ) -> None:
        out.append(Mutant(name, file, section, old, new, tests, equivalent))

    # the dispatcher's files (dispatchers/store/sql)
    claim, complete, leases, health = (
        f"{STORE_SQL}/{name}.sql" for name in ("claim", "complete", "leases", "health")
    )
    # -- the fences of completion and renewal, each alone -------------------------
    owner, attempt, running = (
        "AND m.lease_owner = %(owner)s",
        "AND m.attempts = o.attempt",
        "AND m.state = (SELECT 'running')",
    )
    for cte, tail in (("done", "AND o.state = 'delivered'"), ("updated", "AND o.state <>")):
        fence = f"WHERE m.id = o.id {attempt} {owner} {running} {tail}"
        add(f"complete_{cte}_owner", complete, "complete", fence,
            f"WHERE m.id = o.id {attempt} {running} {tail}", "fences")  # fmt: skip
        add(f"complete_{cte}_attempt", complete, "complete", fence,
            f"WHERE m.id = o.id {owner} {running} {tail}", "fences")  # fmt: skip
        add(f"complete_{cte}_running", complete, "complete", fence,
            f"WHERE m.id = o.id {attempt} {owner} {tail}", "fences")  # fmt: skip
    fence = f"WHERE m.id = o.id {attempt} {owner} {running} RETURNING"
    add("complete_delivered_owner", complete, "complete_delivered", fence,
        f"WHERE m.id = o.id {attempt} {running} RETURNING", "fences")  # fmt: skip
    add("complete_delivered_attempt", complete, "complete_delivered", fence,
        f"WHERE m.id = o.id {owner} {running} RETURNING", "fences")  # fmt: skip
    add("complete_delivered_running", complete, "complete_delivered", fence,
        f"WHERE m.id = o.id {attempt} {owner} RETURNING", "fences")  # fmt: skip
    add("renew_owner", leases, "renew", owner, "", "fences")
    add("renew_attempt", leases, "renew", "AND m.attempts = held.attempt", "", "fences")
    add("renew_running", leases, "renew", running, "", "fences")
    add("release_keeps_the_attempt", complete, "complete",
        "attempts = CASE WHEN o.sent THEN m.attempts ELSE m.attempts - 1 END",
        "attempts = m.attempts", "fences")  # fmt: skip
    add("rescue_running", complete, "rescue", "WHERE state = 'running' AND lease_until < now()",
        "WHERE lease_until < now()", "fences")  # fmt: skip
    add("rescue_spent", complete, "rescue",
        "SET state = CASE WHEN m.attempts >= m.max_attempts",
        "SET state = CASE WHEN m.attempts > m.max_attempts", "fences")  # fmt: skip

    # -- circuit breakers and holds ------------------------------------------------
    probe_fence = "AND dh.probe_owner = %(owner)s"
    only_probing = (
        "a probe owner implies 'probing': the table's CHECK ((state = 'probing') ="
        " (probe_owner IS NOT NULL)), which test_only_a_probing_breaker_has_a_probe_owner pins"
    )
    for statement in ("health_close", "health_reopen"):
        add(f"{statement}_owner", health, statement, probe_fence, "", "health")
        add(f"{statement}_probing", health, statement, "AND dh.state = 'probing'", "", "health",
            only_probing)  # fmt: skip
    doubled = "%(backoff_s)s * power(2, LEAST(dh.failed_probes + 1, 30))"
    add("health_reopen_not_doubled", health, "health_reopen", doubled,
        "%(backoff_s)s * power(2, 1)", "health")  # fmt: skip
    add("health_reopen_uncapped", health, "health_reopen",
        f"LEAST({doubled}, %(backoff_max_s)s)", doubled, "health")  # fmt: skip
    add("health_reopen_no_hold", health, "health_reopen", "%(backoff_max_s)s), %(hold_s)s))",
        "%(backoff_max_s)s), 0))", "health")  # fmt: skip
    add("health_reopen_not_counted", health, "health_reopen",
        "failed_probes = dh.failed_probes + 1", "failed_probes = dh.failed_probes",
        "health")  # fmt: skip
    add("probe_lease_none", claim, "health_probed",
        "blocked_until = now() + make_interval(secs => %(lease_s)s)",
        "blocked_until = now()", "health")  # fmt: skip
    add("probe_before_backoff", claim, "health_probes",
        "AND dh.state <> 'held' AND dh.blocked_until <= now()",
        "AND dh.state <> 'held'", "health")  # fmt: skip
    add("probe_takes_a_batch", claim, "destinations_due",
        "WHEN probe.destination IS NOT NULL THEN 1",
        "WHEN probe.destination IS NOT NULL THEN %(limit)s", "health")  # fmt: skip
    add("held_claimed_during_hold", claim, "health_admitted",
        "(dh.state = 'held' AND dh.blocked_until <= now())", "(dh.state = 'held')",
        "health")  # fmt: skip
    add("health_open_reopens", health, "health_open", "WHERE dh.state = 'held'", "", "health")
    add("health_open_shortens_hold", health, "health_open",
        "GREATEST(dh.blocked_until, excluded.blocked_until)", "excluded.blocked_until",
        "health")  # fmt: skip
    add("health_hold_shortens", health, "health_hold",
        "WHERE dh.blocked_until < excluded.blocked_until", "", "health")  # fmt: skip
    add("health_alone_ignores_open", claim, "health_alone",
        "AND (dh.blocked_until > now() OR dh.state <> 'held')",
        "AND dh.blocked_until > now()", "health")  # fmt: skip

    # -- slots ---------------------------------------------------------------------
    s = f"{LIBRARY_SQL}/slots.sql"
    add("cap_removed_keeps_one_more", s, "slots_synced",
        "s.slot > COALESCE(b.max_concurrency, 0)",
        "s.slot > COALESCE(b.max_concurrency, 0) + 1", "slots")  # fmt: skip
    add("cap_seats_one_fewer", s, "slots_synced",
        "generate_series(1, COALESCE(b.max_concurrency, 0))",
        "generate_series(1, COALESCE(b.max_concurrency, 0) - 1)", "slots")  # fmt: skip
    add("cap_waiting_forgets_unslotted", s, "slots_synced",
        "WHERE NOT EXISTS (SELECT 1 FROM {schema}.destination_slots AS s"
        " WHERE s.message_id = m.id)",
        "WHERE false", "slots")  # fmt: skip
    add("cap_listed_none", s, "slots_synced",
        "WHERE w.message_id NOT IN (SELECT message_id FROM cap_seated)", "WHERE false",
        "slots")  # fmt: skip
    add("cap_reseated_none", s, "slots_synced",
        "WHERE c.present AND s.destination = c.destination",
        "WHERE false AND s.destination = c.destination", "slots")  # fmt: skip
    add("cap_unlisted_keeps_uncapped", s, "slots_synced",
        "AND (b.max_concurrency IS NULL OR u.message_id IN",
        "AND (u.message_id IN", "slots")  # fmt: skip
    add("rate_period_of_one", s, "slots_synced",
        "make_interval(secs => b.rate_burst / b.rate_limit_per_s)",
        "make_interval(secs => 1 / b.rate_limit_per_s)", "slots")  # fmt: skip
    add("rate_removed_keeps_one_more", s, "slots_synced",
        "s.slot > COALESCE(b.rate_burst, 0)", "s.slot > COALESCE(b.rate_burst, 0) + 1",
        "slots")  # fmt: skip
    add("rate_kept_period_unchanged", s, "slots_synced",
        "DO UPDATE SET period = EXCLUDED.period", "DO NOTHING", "slots")  # fmt: skip
    add("rate_change_grants_a_burst", s, "slots_synced",
        "DO UPDATE SET period = EXCLUDED.period",
        "DO UPDATE SET period = EXCLUDED.period, next_at = now()", "slots")  # fmt: skip
    add("slot_freed_not_passed", complete, "slots_passed", "SET message_id = h.message_id",
        "SET message_id = NULL", "slots")  # fmt: skip
    add("slot_passed_to_the_ending", complete, "slots_passed",
        "AND u.message_id NOT IN (SELECT id FROM ending)", "", "slots")  # fmt: skip
    add("complete_frees_no_slot", complete, "complete", "ending AS ( SELECT id FROM applied )",
        "ending AS ( SELECT id FROM applied WHERE false )", "slots")  # fmt: skip
    add("complete_delivered_frees_no_slot", complete, "complete_delivered",
        "ending AS ( SELECT id FROM done )", "ending AS ( SELECT id FROM done WHERE false )",
        "slots")  # fmt: skip
    add("rescue_frees_only_rescued", complete, "rescue",
        "FROM {schema}.destination_slots AS s WHERE s.message_id IS NOT NULL",
        "FROM {schema}.destination_slots AS s WHERE false", "slots")  # fmt: skip
    add("rescue_keeps_ended_unseated", complete, "rescue",
        "FROM {schema}.unseated_requests AS u WHERE (SELECT",
        "FROM {schema}.unseated_requests AS u WHERE false AND (SELECT", "slots")  # fmt: skip
    add("claim_takes_a_held_slot", claim, "policy_slots",
        "WHERE s.destination = w.destination AND s.message_id IS NULL",
        "WHERE s.destination = w.destination", "slots")  # fmt: skip
    add("claim_takes_a_rate_slot_early", claim, "policy_slots",
        "WHERE s.destination = w.destination AND s.next_at <= now()",
        "WHERE s.destination = w.destination", "slots")  # fmt: skip

    # -- ordering keys ---------------------------------------------------------------
    e = f"{LIBRARY_SQL}/enqueue.sql"
    add("ordering_key_ignored", claim, "ordering_key_free",
        "(m.ordering_key IS NULL OR NOT EXISTS", "(true OR NOT EXISTS", "ordering")  # fmt: skip
    add("ordering_later_running_ignored", claim, "ordering_key_free",
        "AND (other.id < m.id OR other.state = 'running')", "AND other.id < m.id",
        "ordering")  # fmt: skip
    add("ordering_paused_ignored", claim, "ordering_key_free",
        "other.state IN ('ready', 'running', 'paused')", "other.state IN ('ready', 'running')",
        "ordering")  # fmt: skip
    add("ordering_dead_holds", claim, "ordering_key_free",
        "other.state IN ('ready', 'running', 'paused')",
        "other.state IN ('ready', 'running', 'paused', 'dead')", "ordering")  # fmt: skip
    add("ordered_no_lock", e, "ordered", "WHERE k.ordering_key IS NOT NULL", "WHERE false",
        "ordering")  # fmt: skip
    add("ordered_one_lock_for_every_key", e, "ordered",
        "hashtextextended(k.ordering_key,", "hashtextextended('',", "ordering")  # fmt: skip
    # the id drawn before the key's lock, the lock still taken (and waited on)
    # before the message is written; test_ordering_clause_order.py sees it
    add("enqueue_id_before_the_lock", e, "enqueue",
        "nextval('{schema}.messages_id_seq'), %(digest)s"
        " FROM (SELECT count(*) FROM ordered) AS after_lock",
        "drawn.id, %(digest)s"
        " FROM (SELECT nextval('{schema}.messages_id_seq') AS id) AS drawn"
        " CROSS JOIN LATERAL (SELECT count(*) FROM ordered WHERE drawn.id IS NOT NULL)"
        " AS after_lock", "ordering")  # fmt: skip
    add("publish_id_before_the_lock", e, "publish",
        "COALESCE(k.message_id, nextval('{schema}.messages_id_seq')) AS message_id"
        " FROM subscribed AS s CROSS JOIN (SELECT count(*) FROM ordered) AS after_lock",
        "COALESCE(k.message_id, s.drawn) AS message_id"
        " FROM (SELECT *, nextval('{schema}.messages_id_seq') AS drawn FROM subscribed) AS s"
        " CROSS JOIN LATERAL (SELECT count(*) FROM ordered WHERE s.drawn IS NOT NULL)"
        " AS after_lock", "ordering")  # fmt: skip
    add("replay_event_id_before_the_lock", f"{LIBRARY_SQL}/admin.sql", "replay_event",
        "nextval('{schema}.messages_id_seq') FROM source"
        " CROSS JOIN (SELECT count(*) FROM ordered) AS after_lock",
        "drawn.id FROM source"
        " CROSS JOIN (SELECT nextval('{schema}.messages_id_seq') AS id) AS drawn"
        " CROSS JOIN LATERAL (SELECT count(*) FROM ordered WHERE drawn.id IS NOT NULL)"
        " AS after_lock", "ordering")  # fmt: skip
    add("replay_event_no_lock", f"{LIBRARY_SQL}/admin.sql", "replay_event",
        "WHERE s.ordering_key IS NOT NULL AND NOT EXISTS (SELECT FROM existing)",
        "WHERE false", "ordering")  # fmt: skip
    # the SQL functions, in the migrations that define them last
    lock = (
        "IF {f}.ordering_key IS NOT NULL THEN PERFORM _lock_ordering_key({f}.ordering_key); END IF;"
    )
    enqueue_lock = lock.format(f="enqueue")
    draw = "v_id := nextval('messages_id_seq');"
    add("function_enqueue_id_before_the_lock", f"{MIGRATIONS}/0022_sql_producers.sql", "enqueue",
        f"{enqueue_lock} {draw}", f"{draw} {enqueue_lock}", "ordering")  # fmt: skip
    add("function_enqueue_no_lock", f"{MIGRATIONS}/0022_sql_producers.sql", "enqueue",
        f"{enqueue_lock} {draw}", draw, "ordering")  # fmt: skip
    # publish draws its ids in _fan_out, in the statement that writes them: the
    # lock taken after the fan-out comes after the draw (and the writes)
    publish_lock = lock.format(f="publish")
    fan_out = (
        "v_fanned := _fan_out(publish.event_type, v_key, v_digest, v_body, v_tenant,"
        " publish.ordering_key, COALESCE(publish.max_attempts, 8), v_trace, NULL, true);"
    )
    add("function_publish_ids_before_the_lock", f"{MIGRATIONS}/0028_alerts.sql", "publish",
        f"{publish_lock} {fan_out}", f"{fan_out} {publish_lock}", "ordering")  # fmt: skip
    add("function_publish_no_lock", f"{MIGRATIONS}/0028_alerts.sql", "publish",
        f"{publish_lock} {fan_out}", fan_out, "ordering")  # fmt: skip
    return out


MUTANTS = {m.name: m for m in _mutants()}


@dataclass(frozen=True)
class Verdict:
    status: str  # "killed", "survived", "not applicable", "error"
    detail: str
    seconds: float


def _test_files(tree: Path) -> list[str]:
    return sorted(p.relative_to(tree).as_posix() for p in (tree / "tests").rglob("test_*.py"))


def resolve(reference: str, tree: Path = ROOT) -> str:
    """The pytest argument a set's ``reference`` names in ``tree``: the one test
    file whose path ends with its file part, and its node, if any."""
    file, sep, node = reference.partition("::")
    found = [f for f in _test_files(tree) if f == file or f.endswith(f"/{file}")]
    if len(found) != 1:
        where = ", ".join(found) if found else "no file"
        raise LookupError(f"{reference}: {file} names {where} under tests/")
    return f"{found[0]}{sep}{node}"


def _defines(path: Path, node: str) -> bool:
    """Whether the test file at ``path`` defines the test ``node`` (``name``, or
    ``Class::name``; a parameter id in brackets is ignored)."""
    body: list[ast.stmt] = ast.parse(path.read_text("utf-8")).body
    for part in node.split("[", 1)[0].split("::"):
        found = [
            s for s in body
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and s.name == part
        ]  # fmt: skip
        if not found:
            return False
        body = found[0].body if isinstance(found[0], ast.ClassDef) else []
    return True


def stale_tests(tree: Path = ROOT) -> list[str]:
    """What is wrong with the sets' references in ``tree``, one line each: a file
    part that names no test file or several, a test its file does not define."""
    problems = []
    for name, references in SETS.items():
        for reference in references:
            try:
                path, _, node = resolve(reference, tree).partition("::")
            except LookupError as exc:
                problems.append(f"set {name}: {exc}")
                continue
            if node and not _defines(tree / path, node):
                problems.append(f"set {name}: {path} defines no test {node}")
    return problems


def stale_mutants(
    chosen: Sequence[Mutant] = tuple(MUTANTS.values()), tree: Path = ROOT
) -> list[str]:
    """The mutants of ``chosen`` that do not apply to ``tree``, each with why: its
    text is not once in its section (or changes only comments), its set is not in
    :data:`SETS`, or a later migration defines its function again."""
    problems = []
    for mutant in chosen:
        if mutant.tests not in SETS:
            problems.append(f"{mutant.name}: no set {mutant.tests!r}")
        elif _applied(mutant, tree) is None:
            problems.append(
                f"{mutant.name}: {' '.join(mutant.old.split())!r} is not once in"
                f" {mutant.file}:{mutant.section}, or only in comments"
            )
        elif _is_migration(mutant.file):
            later = [
                f.name for f in sorted((tree / MIGRATIONS).glob("*.sql"))
                if f.name > Path(mutant.file).name
                and _function_start(mutant.section).search(f.read_text("utf-8"))
            ]  # fmt: skip
            if later:
                problems.append(f"{mutant.name}: {', '.join(later)} defines {mutant.section} again")
    return problems


def _copies(jobs: int) -> list[Path]:
    """``jobs`` snapshots of the tree, each in a temporary directory: the SQL to
    mutate, and the code and tests to run against it, all of one moment (the
    working tree may change while the mutants run; the first snapshot is taken
    from it, the others from the first)."""
    copies: list[Path] = []
    for _ in range(jobs):
        source = copies[0] if copies else ROOT
        work = Path(tempfile.mkdtemp(prefix="outbox-sql-mutant-"))
        for part in SNAPSHOT:
            if (source / part).is_dir():
                shutil.copytree(source / part, work / part, ignore=IGNORED)
            else:
                shutil.copy2(source / part, work / part)
        copies.append(work)
    return copies


def _in_turn(
    jobs: Sequence[Callable[[Path], _T]], copies: Sequence[Path]
) -> Iterator[tuple[int, _T]]:
    """Run each job in a copy no other job is using, as many at a time as there
    are copies; yield each job's index and result as it finishes."""
    free: queue.SimpleQueue[Path] = queue.SimpleQueue()
    for copy in copies:
        free.put(copy)

    def run(job: Callable[[Path], _T]) -> _T:
        work = free.get()
        try:
            return job(work)
        finally:
            free.put(work)

    with ThreadPoolExecutor(max_workers=len(copies)) as pool:
        futures = {pool.submit(run, job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _pytest(work: Path, tests: Sequence[str], log: Path) -> tuple[int, str]:
    """Run ``tests`` in the snapshot ``work`` (its packages come first on the path),
    the statements loaded from its files (``sql/`` and the runtime's packages),
    stopping at the first failure."""
    env = {**os.environ, ENV: str(work), "OUTBOX_TEST_SERVERS": "embedded"}
    env.pop("PYTHONPATH", None)
    command = [
        sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider",
        *(arg for plugin in UNUSED_PLUGINS for arg in ("-p", f"no:{plugin}")),
        "-n", "0", "-q", "-x", "-rfE", "--timeout", "90",
        *(resolve(t, work) for t in tests),
    ]  # fmt: skip
    with log.open("w") as out:
        run = subprocess.run(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    return run.returncode, log.read_text(errors="replace")


def _applied(mutant: Mutant, tree: Path) -> tuple[str, str] | None:
    """The text of the mutant's file in ``tree``, and the text with the mutation
    made; None when it does not apply or changes no statement (only comments)."""
    original = (tree / mutant.file).read_text("utf-8")
    mutated = mutant.apply(original)
    if mutated is None or _statements(mutant.file, mutated) == _statements(mutant.file, original):
        return None
    return original, mutated


def run_mutant(mutant: Mutant, work: Path) -> Verdict:
    start = time.monotonic()
    path = work / mutant.file
    texts = _applied(mutant, work)
    if texts is None:
        why = f"{mutant.old!r} is not once in {mutant.section}, or only in comments"
        return Verdict("not applicable", why, 0.0)
    original, mutated = texts
    path.write_text(mutated, "utf-8")
    try:
        code, output = _pytest(work, SETS[mutant.tests], work / f"{mutant.name}.log")
    finally:
        path.write_text(original, "utf-8")
    seconds = time.monotonic() - start
    if code == 0:
        return Verdict("survived", "", seconds)
    if code == 1:
        failed = sorted(set(_FAILED.findall(output)))
        return Verdict("killed", ", ".join(f.removeprefix("tests/") for f in failed), seconds)
    return Verdict("error", f"pytest exited {code}:\n{output[-2000:]}", seconds)


def _score(name: str, statuses: Sequence[str]) -> scores.Score:
    """Set ``name``'s score from the statuses of its mutants."""
    return scores.Score(
        "sql",
        name,
        mutants=len(statuses),
        killed=statuses.count("killed"),
        equivalent=statuses.count("survived, equivalent"),
        command=f"python -m tests.mutation.sql_mutants --set {name}",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation.sql_mutants", description=__doc__.splitlines()[0]
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="default: every mutant")
    parser.add_argument("--list", action="store_true", help="name the mutants and their sets")
    parser.add_argument(
        "--set", dest="sets", action="append", choices=sorted(SETS), metavar="SET",
        help=f"only the mutants of this set ({', '.join(SETS)}); may be repeated",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the copies and the logs")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check that each mutant applies and each test the sets name exists; run none",
    )
    parser.add_argument(
        "--jobs",
        type=_positive,
        default=JOBS,
        help=f"how many mutants run at a time (default: two per core, {JOBS} here)",
    )
    parser.add_argument(
        "--no-record",
        action="store_true",
        help=f"print the scores, do not write them into {scores.PAGE.relative_to(ROOT)}",
    )
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name:38} {m.tests:9} {m.file}:{m.section}")
        return 0
    unknown = sorted(set(args.names) - set(MUTANTS))
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(unknown)}; --list names them")
    chosen = [MUTANTS[n] for n in args.names] if args.names else list(MUTANTS.values())
    if args.sets:
        chosen = [m for m in chosen if m.tests in args.sets]
    problems = stale_tests() + stale_mutants(chosen)
    for problem in problems:
        print(problem)
    if args.check or problems:
        return 1 if problems else 0
    copies = _copies(args.jobs)
    try:
        return _run(chosen, copies, record=not args.no_record)
    finally:
        if args.keep:
            print(f"kept in {', '.join(map(str, copies))}")
        else:
            for work in copies:
                shutil.rmtree(work, ignore_errors=True)


def _run(chosen: Sequence[Mutant], copies: Sequence[Path], *, record: bool) -> int:
    """Run each set of ``chosen`` on the unchanged copies, then each mutant; print
    each verdict as it comes and each set's score, and record the scores of the
    sets run whole. 1 when a set fails unchanged or a mutant is not killed nor
    excused as equivalent."""
    sets = list(dict.fromkeys(m.tests for m in chosen))

    def unchanged(name: str) -> Callable[[Path], tuple[int, str]]:
        return lambda work: _pytest(work, SETS[name], work / f"unchanged-{name}.log")

    for i, (code, output) in _in_turn([unchanged(name) for name in sets], copies):
        if code != 0:
            print(f"set {sets[i]} fails on the unchanged SQL (exit {code}):\n{output[-3000:]}")
            return 1
        print(f"set {sets[i]}: passes on the unchanged SQL", flush=True)

    def mutated(mutant: Mutant) -> Callable[[Path], Verdict]:
        return lambda work: run_mutant(mutant, work)

    statuses: dict[str, list[str]] = {name: [] for name in sets}
    failed = False
    for i, verdict in _in_turn([mutated(m) for m in chosen], copies):
        mutant = chosen[i]
        status, detail = verdict.status, verdict.detail
        if status == "survived" and mutant.equivalent:
            status, detail = "survived, equivalent", mutant.equivalent
        failed = failed or status not in ("killed", "survived, equivalent")
        statuses[mutant.tests].append(status)
        detail = f": {detail}" if detail else ""
        print(f"{mutant.name:38} {status} ({verdict.seconds:.0f} s){detail}", flush=True)
    for name, done in statuses.items():
        score = _score(name, done)
        whole = len(done) == sum(m.tests == name for m in MUTANTS.values())
        print(f"set {name}: {score.summary()}" + ("" if whole else " (only these mutants)"))
        if record and whole:
            scores.record(score)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
