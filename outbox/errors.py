"""Errors raised by the outbox library and its dispatcher.

The tree::

    OutboxError                 base; raised itself when the database contradicts the library
    ├── InvalidArgument         a bad argument that is not part of a message; names it
    │   └── InvalidMessage      a bad message, event or endpoint field; nothing written
    │       └── IdempotencyKeyReused  a key given again for another request or event
    ├── ConfigurationError      settings that contradict each other or cannot work
    │   └── SecretKeyMissing    a signing secret sealed under a key not configured
    ├── MigrationError          a migration could not be applied, or applied files changed
    ├── SchemaNotMigrated       the outbox's tables are not in the schema named
    ├── SealBroken              a sealed signing secret does not open under its key
    ├── InvalidSignature        a request failed Standard Webhooks verification
    ├── BlockedDestination      the SSRF guard refused every address of a destination
    ├── DispatcherFailed        a dispatcher stopped on what waiting will not heal
    │   ├── DatabaseUnusable    its database cannot serve it, and waiting will not help
    │   │   └── DatabaseUnreachable  no connection to it could be opened at start-up
    │   ├── SecretKeysMissing   secrets in force are sealed under keys it was not given
    │   └── DrainStalled        a drain made no progress for ``drain_timeout``
    └── UsageError              an ``outbox`` command line that cannot be carried out

``InvalidArgument``, ``InvalidMessage`` and ``ConfigurationError`` are also
``ValueError``\\ s. Database errors pass through unchanged unless a module says
what it translates.

Design: docs/explanation/design/errors.md
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error raised by ``outbox`` and ``dispatchers``."""


class InvalidArgument(OutboxError, ValueError):
    """An argument was rejected before anything was read or written.

    ``field`` names the argument at fault; the message text names it too.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidMessage(InvalidArgument):
    """A message, event or endpoint was rejected before anything was written.

    ``field`` names the field at fault (``url``, ``headers[X-Name]``, ``payload``...).
    """


class IdempotencyKeyReused(InvalidMessage):
    """An idempotency key was given again with a different request (or, for
    ``publish``, a different event type or payload) than the one that took it.

    Raised before anything is written, in the caller's transaction, which stays
    usable. ``key`` is the key; ``message_id`` the message that holds it (None for
    an event, whose key holds one message per endpoint). The request itself is
    never quoted: it may hold secrets.
    """

    def __init__(self, key: str, *, message_id: int | None = None) -> None:
        self.key = key
        self.message_id = message_id
        if message_id is None:
            problem = (
                f"event {key!r} was published before with another event type or "
                "payload; a new event needs a new key"
            )
        else:
            problem = (
                f"{key!r} already holds message {message_id}, made for another "
                "request (method, URL, headers, content type or body); "
                "a new request needs a new key"
            )
        super().__init__("idempotency_key", problem)


class ConfigurationError(OutboxError, ValueError):
    """Settings that cannot work together, such as a lease shorter than a request."""


class MigrationError(OutboxError):
    """The schema could not be migrated."""


class SchemaNotMigrated(OutboxError):
    """The outbox's tables are not in ``schema``: it was never migrated (or it is
    the wrong schema name); or (``behind``) it was migrated by an older version
    of this package, and lacks a column this one writes."""

    def __init__(self, schema: str, *, behind: bool = False) -> None:
        self.schema = schema
        self.behind = behind
        state = "is behind this version of outbox" if behind else "has no outbox tables"
        super().__init__(
            f"schema {schema!r} {state}: run `outbox migrate --schema {schema}` "
            "(or outbox.migrate(url, schema=...)) first"
        )


class InvalidSignature(OutboxError):
    """A request failed Standard Webhooks verification; the message says why."""
