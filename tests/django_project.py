"""A minimal Django project on the test server: settings made in the test, one
database, no apps. Django's settings are made once per process, so the project
serves one database; :func:`use_database` points it at each test's own."""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.db import connections
from psycopg.conninfo import conninfo_to_dict


def database_settings(url: str) -> dict[str, Any]:
    """Django's ``DATABASES["default"]`` for a libpq URL (the embedded server's
    gives its Unix socket directory as ``host``)."""
    info = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info["dbname"],
        "HOST": info.get("host", ""),
        "PORT": info.get("port", ""),
        "USER": info.get("user", ""),
        "PASSWORD": info.get("password", ""),
    }


def use_database(url: str) -> None:
    """Configure Django on first use, then make ``default`` connect to ``url``."""
    if not settings.configured:
        settings.configure(DATABASES={"default": database_settings(url)}, USE_TZ=True)
        django.setup()
    connections.close_all()
    connections["default"].settings_dict.update(database_settings(url))
