"""The management API: ``/api/v1``, JSON over HTTP, served by the dashboard's
process (``outbox ui``, or ``outbox ui --api-only`` for the API alone).

The parts:

- :mod:`~dispatchers.api.app`: the aiohttp application, authentication,
  validation, and errors as problem details;
- :mod:`~dispatchers.api.calls`: what a route is and what its handler gets;
- :mod:`~dispatchers.api.routes`: the route table, gathered from
  :mod:`~dispatchers.api.endpoint_routes`, :mod:`~dispatchers.api.message_routes`,
  :mod:`~dispatchers.api.setting_routes` and :mod:`~dispatchers.api.tenant_routes`,
  which read endpoints as a token may see them through
  :mod:`~dispatchers.api.endpoint_views`;
- :mod:`~dispatchers.api.requests`, :mod:`~dispatchers.api.responses`: the pydantic
  models the handlers validate requests with, and those they answer;
- :mod:`~dispatchers.api.openapi`: the OpenAPI 3.1 document, built from those
  models and the route table (pure);
- :mod:`~dispatchers.api.store`: where its work runs, its tokens and audit
  log (every read through :mod:`dispatchers.store.web`);
- :mod:`~dispatchers.api.tokens`, :mod:`~dispatchers.api.cursors`,
  :mod:`~dispatchers.api.fingerprints`, :mod:`~dispatchers.api.problems`:
  bearer tokens, page cursors, audit fingerprints and problem details (pure
  but the last, which answers through aiohttp).

The dashboard mounts it (``dispatchers.ui`` imports this package, never the
reverse); ``outbox api-tokens`` makes its tokens.
"""
