"""Defaults shared by the library, the dispatcher and the command line, defined once."""

from __future__ import annotations

DEFAULT_SCHEMA = "outbox"
"""The PostgreSQL schema of the outbox tables."""

DEFAULT_MAX_ATTEMPTS = 12
"""The attempt budget of a message enqueued without one."""

DEFAULT_WEBHOOK_MAX_ATTEMPTS = 8
"""An immediate attempt plus the seven retries of the Standard Webhooks schedule
(5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h): about a day."""

MAX_SPAN = 100 * 365 * 24 * 3600.0
"""The longest span, in seconds (100 years): the retention, how long an endpoint may
fail before it is disabled, how far back a ``--since`` reaches, how long a rotated
secret keeps signing."""

MAX_RETRY_DELAY = 7 * 24 * 3600.0
"""The longest delay before a next attempt (a week): the bound of every retry
policy's answer and of each delay of a stored retry schedule."""

MAX_RETRY_SCHEDULE = 100
"""The most delays a stored retry schedule lists (its last one repeats, so a
longer list would say nothing a message's attempt budget does not)."""
