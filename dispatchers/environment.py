"""Every environment variable an ``outbox`` command reads: read here, and nowhere
else in the runtime or the library.

``OUTBOX_DATABASE_URL``, ``DATABASE_URL``, ``OUTBOX_EMBEDDED_DIR``,
``OUTBOX_SECRETS_KEY``, ``OUTBOX_PROXY`` and ``OUTBOX_UI_TOKEN``; an empty
variable counts as unset. A dispatcher run from Python, the library and ``outbox
bench`` read none of them.

Design: docs/explanation/design/environment.md
"""

from __future__ import annotations

import os

DATABASE_URL_VARIABLES = ("OUTBOX_DATABASE_URL", "DATABASE_URL")
EMBEDDED_DIR_VARIABLE = "OUTBOX_EMBEDDED_DIR"
SECRETS_KEY_VARIABLE = "OUTBOX_SECRETS_KEY"
PROXY_VARIABLE = "OUTBOX_PROXY"
UI_TOKEN_VARIABLE = "OUTBOX_UI_TOKEN"  # noqa: S105 (a variable's name, not a token)


def _read(name: str) -> str | None:
    return os.environ.get(name) or None


def database_url_variable() -> str | None:
    """The name of the variable :func:`database_url` takes its URL from, or None."""
    return next((name for name in DATABASE_URL_VARIABLES if _read(name)), None)


def database_url() -> str | None:
    """``$OUTBOX_DATABASE_URL``, else ``$DATABASE_URL``, else None."""
    name = database_url_variable()
    return None if name is None else _read(name)


def embedded_dir() -> str | None:
    """``$OUTBOX_EMBEDDED_DIR``, or None."""
    return _read(EMBEDDED_DIR_VARIABLE)


def secrets_key() -> str | None:
    """``$OUTBOX_SECRETS_KEY`` when it holds more than blanks, else None."""
    value = _read(SECRETS_KEY_VARIABLE)
    return value if value and value.strip() else None


def proxy() -> str | None:
    """``$OUTBOX_PROXY`` without surrounding blanks, or None."""
    value = (_read(PROXY_VARIABLE) or "").strip()
    return value or None


def ui_token() -> str | None:
    """``$OUTBOX_UI_TOKEN``, or None."""
    return _read(UI_TOKEN_VARIABLE)
