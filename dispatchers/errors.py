"""Why a dispatcher stops: the errors that end it (exit status 1), below every
layer that raises them (the store's preflight, the runtime's watchdog) and above
none."""

from __future__ import annotations

from outbox.errors import OutboxError


class DispatcherFailed(OutboxError):
    """A dispatcher stopped on what waiting will not heal (exit status 1)."""


class DatabaseUnusable(DispatcherFailed):
    """The database cannot be used as the dispatcher must: unreachable, refusing
    its role, not migrated, lacking privileges, or failing with a permanent error."""


class DatabaseUnreachable(DatabaseUnusable):
    """No connection to the database could be opened at start-up (refused, timed
    out, or refused the role: libpq does not always tell these apart). A process
    serving several databases starts without it and keeps trying; one serving a
    single database exits."""


class DrainStalled(DispatcherFailed):
    """A drain made no progress for ``drain_timeout`` seconds."""
