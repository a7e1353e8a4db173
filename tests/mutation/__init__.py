"""Mutation testing: does a test fail when the code it covers is changed?

``python -m tests.mutation.python_mutants`` runs mutmut over the pure decision
modules, each against the unit tests that cover it; ``python -m
tests.mutation.sql_mutants`` changes one statement of ``sql/queries`` or
``dispatchers/store/sql`` at a time (in a copy) and runs the integration tests
that must notice. Neither changes the working tree: both work in temporary
copies.
"""
