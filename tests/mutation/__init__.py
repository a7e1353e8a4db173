"""Mutation testing: does a test fail when the code it covers is changed?

``python -m tests.mutation.python_mutants`` runs mutmut over the pure decision
modules, each against the unit tests that cover it; ``python -m
tests.mutation.sql_mutants`` changes one statement of ``sql/queries``,
``dispatchers/store/sql`` or a migration's function at a time (in a copy) and
runs the tests that must notice. Neither changes the code or tests of the
working tree: both work in temporary copies, and write their scores into the
table of ``docs/contributing/testing.md`` (``tests/mutation/scores.py``). CI runs
both in full before the suite, with ``--no-record``.
``--check`` runs no mutant: it checks that what each runner names (tests,
statements, equivalent mutants) still exists; ``tests/unit/test_mutation_runners.py``
runs it with the rest of the suite.
"""
