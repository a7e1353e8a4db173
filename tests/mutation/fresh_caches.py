"""A pytest plugin for mutation runs: empty the caches of the module under mutation
before each test (``-p tests.mutation.fresh_caches``, the module named by
``OUTBOX_MUTATED_MODULE``, such as ``outbox._message``).

mutmut runs the tests of each mutant in a process forked from one that ran the
whole suite first, and notes which tests reach which function. A function behind
a cache (``functools.cache``, ``lru_cache``) that an earlier test filled is not
called again for the same arguments: its mutants would look unreached, or
survive because the cache answers with what the unmutated code computed.
"""

from __future__ import annotations

import importlib
import os

import pytest

ENV = "OUTBOX_MUTATED_MODULE"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    name = os.environ.get(ENV)
    if not name:
        return
    for value in list(vars(importlib.import_module(name)).values()):
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()
