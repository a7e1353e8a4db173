"""Errors raised by the outbox library and its dispatcher.

The tree::

    OutboxError                 base of everything this project raises
    ├── InvalidMessage          bad input to enqueue/publish; names the field; nothing written
    ├── ConfigurationError      settings that contradict each other or cannot work
    ├── MigrationError          a migration could not be applied, or applied files changed
    └── DatabaseUnavailable     PostgreSQL could not be reached or answered with a
                                connection-class error (SQLSTATE class 08, 57P0x)
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error raised by ``outbox`` and ``dispatchers``."""


class InvalidMessage(OutboxError, ValueError):
    """A message (or event) was rejected before anything was written.

    ``field`` names the argument at fault; the message text names it too.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ConfigurationError(OutboxError, ValueError):
    """Settings that cannot work together, such as a lease shorter than a request."""


class MigrationError(OutboxError):
    """The schema could not be migrated."""


class DatabaseUnavailable(OutboxError):
    """PostgreSQL could not be reached, or dropped the connection."""
