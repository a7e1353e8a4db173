"""The route table: every operation of the API, in the order the OpenAPI
document lists them."""

from __future__ import annotations

from dispatchers.api import (
    endpoint_routes,
    message_routes,
    retention_routes,
    setting_routes,
    tenant_routes,
)
from dispatchers.api.calls import Route

ROUTES: tuple[Route, ...] = (
    *setting_routes.ROUTES[:3],
    *endpoint_routes.ROUTES,
    *message_routes.ROUTES,
    *setting_routes.ROUTES[3:],
    *retention_routes.ROUTES,
    *tenant_routes.ROUTES,
)


def served(*, read_only: bool) -> tuple[Route, ...]:
    """The routes served: without the writing ones in read-only mode (a change
    is then a 405, and the document does not list it)."""
    return tuple(r for r in ROUTES if not (read_only and r.writes))


def refused(*, read_only: bool) -> dict[str, tuple[str, ...]]:
    """The paths (aiohttp's patterns) where a read-only server refuses every
    change (405), each with the methods it still serves there: GET, or none."""
    if not read_only:
        return {}
    changed = dict.fromkeys(r.pattern or r.path for r in ROUTES if r.writes)
    return {
        path: tuple(r.method for r in ROUTES if not r.writes and (r.pattern or r.path) == path)
        for path in changed
    }
