"""The consumer portal: pages where a tenant's own users manage the tenant's
webhook endpoints and see its deliveries, and nothing of any other tenant.

``outbox portal-link --tenant ID`` makes a link (:mod:`outbox.portal`); the
dashboard's process (``outbox ui``) serves the pages under ``/portal/<token>/``,
under the dashboard's security model: its Host check, its headers (the
Content-Security-Policy allowing the dashboard's own script and style sheet
only, with frame-ancestors from ``--portal-frame-ancestors``), and a CSRF field
on every form. The parts:

- :mod:`~dispatchers.portal.app`: the application, its routes, the token guard
  and the headers;
- :mod:`~dispatchers.portal.guard`: CSRF fields, frame-ancestors sources (pure);
- :mod:`~dispatchers.portal.views`: the home page and the deliveries;
- :mod:`~dispatchers.portal.endpoint_views`: the endpoints and their changes;
- :mod:`~dispatchers.portal.pages`: what the pages share, and rendering.

It reads through :mod:`dispatchers.store.web` scoped to the link's tenant: the
functions, and the fields, a tenant's API token reads. The portal uses the
dashboard's connections, keys, bounds and field checks (``dispatchers.ui``);
the dashboard knows nothing of it but the sub-application the command mounts.
"""
