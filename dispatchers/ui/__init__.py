"""``outbox ui``: the operator dashboard, a web view of one database and schema.

Server-rendered pages (aiohttp.web and Jinja2 templates with autoescape), a style
sheet and one small script for live refresh, all served from the package: no
build step, no CDN. The parts:

- :mod:`~dispatchers.ui.app`: the application, its routes, the guard middleware
  and the security headers;
- :mod:`~dispatchers.ui.auth`: sessions, the login token, CSRF, loopback (pure);
- :mod:`~dispatchers.ui.views`: the overview and the message pages and actions;
- :mod:`~dispatchers.ui.dead_pages`: the dead letters, retried or purged by selection;
- :mod:`~dispatchers.ui.endpoint_pages`, :mod:`~dispatchers.ui.endpoint_forms`: the
  endpoints, their secrets, and the forms that add, edit and delete one;
- :mod:`~dispatchers.ui.tenant_pages`: the tenants, and one tenant's page (the other
  lists take a ``tenant`` filter);
- :mod:`~dispatchers.ui.dashboard`: what every request shares, and rendering;
- :mod:`~dispatchers.ui.store`: the database, read-only for pages;
- :mod:`~dispatchers.ui.charts`: per-minute charts as SVG (pure);
- :mod:`~dispatchers.ui.fields`: what a query string or a form may hold (pure);
- :mod:`~dispatchers.ui.limits`: the bounds on connections, sign-ins and pages;
- :mod:`~dispatchers.ui.policy_text`: spans, retry schedules, rate limits and TLS
  digests as the dashboard (and the CLI, which imports it) word them (pure).

The dispatcher never imports this package, nor this package the CLI.
"""
