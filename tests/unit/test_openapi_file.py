"""``docs/reference/openapi.json`` is the document the management API serves:
the committed file equals what ``tests/openapi_file.py`` makes from the code."""

from __future__ import annotations

import json

import pytest

from dispatchers.api import routes
from tests import openapi_file


def test_the_committed_openapi_document_is_the_one_the_api_serves() -> None:
    generated = openapi_file.generate()
    committed = openapi_file.PATH.read_text("utf-8") if openapi_file.PATH.exists() else ""
    if generated != committed:
        pytest.fail(openapi_file.stale(committed, generated), pytrace=False)


def test_the_document_lists_every_route_of_the_table() -> None:
    paths = json.loads(openapi_file.generate())["paths"]
    listed = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    assert listed == {(route.method, route.path) for route in routes.ROUTES}
