"""Webhook endpoints: where published events go, and the secrets that sign them.

All functions run in the caller's transaction (a SQLAlchemy ``Session`` or
``Connection``, or a psycopg ``Connection``) and never commit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from outbox._message import check_url
from outbox._queries import Queries, queries_for
from outbox._transaction import Plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import InvalidArgument, InvalidMessage
from outbox.secrets import check_secret, fingerprint, generate_secret

DEFAULT_ROTATION_OVERLAP = timedelta(hours=24)
MAX_DESCRIPTION = 1000
_EVENT_TYPE = re.compile(r"^[\x21-\x7e]{1,255}\Z")


def check_event_type(value: object, field: str = "event_type") -> str:
    """An event type: 1-255 printable characters, no whitespace."""
    if not isinstance(value, str) or not _EVENT_TYPE.match(value):
        raise InvalidMessage(field, "must be 1-255 printable characters without whitespace")
    if "*" in value:
        raise InvalidMessage(field, "must not contain '*'")
    return value


def check_subscriptions(values: object) -> list[str]:
    """Event type subscriptions: exact types or ``prefix.*`` patterns; empty = all."""
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidMessage("event_types", "must be a list of event types")
    out: list[str] = []
    for value in values:
        if isinstance(value, str) and value.endswith(".*") and len(value) > 2:
            check_event_type(value[:-2], "event_types")
        else:
            check_event_type(value, "event_types")
        if value not in out:
            out.append(value)
    return out


@dataclass(frozen=True)
class Secret:
    """A signing secret; ``expires_at`` is set on the old one during rotation."""

    secret: str = field(repr=False)
    expires_at: datetime | None = None


@dataclass(frozen=True)
class Endpoint:
    """One webhook endpoint, as stored."""

    id: int
    url: str
    description: str
    event_types: list[str]
    secrets: list[Secret] = field(repr=False)
    metadata: dict[str, Any]
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    created_at: datetime
    updated_at: datetime

    def active_secrets(self, now: datetime) -> list[str]:
        """The secrets that sign right now (more than one during a rotation)."""
        return [s.secret for s in self.secrets if s.expires_at is None or s.expires_at > now]

    def as_dict(self, *, show_secrets: bool = False) -> dict[str, Any]:
        """A JSON-friendly view; secrets are masked unless asked for."""
        return {
            "id": self.id,
            "url": self.url,
            "description": self.description,
            "event_types": self.event_types,
            "secrets": [
                {
                    "secret": s.secret if show_secrets else fingerprint(s.secret),
                    "expires_at": s.expires_at,
                }
                for s in self.secrets
            ],
            "metadata": self.metadata,
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "disabled_at": self.disabled_at,
            "failure_streak": self.failure_streak,
            "failing_since": self.failing_since,
            "last_success_at": self.last_success_at,
            "max_concurrency": self.max_concurrency,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _parse_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


class _EndpointRow(NamedTuple):
    """A row of ``endpoint_get`` and ``endpoint_list``, with the database's clock
    (``now``)."""

    id: int
    url: str
    description: str
    event_types: list[str]
    metadata: Any  # jsonb: a dict, or its text from drivers that do not decode jsonb
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    created_at: datetime
    updated_at: datetime
    now: datetime
    #: jsonb, likewise: [{"id", "secret", "expires_at"}], newest first
    secrets: Any

    def stored_secrets(self) -> list[tuple[int, Secret]]:
        """The endpoint's secrets with the ids of their rows, newest first."""
        return [
            (s["id"], Secret(s["secret"], _parse_time(s["expires_at"])))
            for s in _json(self.secrets)
        ]

    def endpoint(self) -> Endpoint:
        return Endpoint(
            id=self.id,
            url=self.url,
            description=self.description,
            event_types=list(self.event_types),
            secrets=[secret for _, secret in self.stored_secrets()],
            metadata=_json(self.metadata),
            enabled=self.enabled,
            disabled_reason=self.disabled_reason,
            disabled_at=self.disabled_at,
            failure_streak=self.failure_streak,
            failing_since=self.failing_since,
            last_success_at=self.last_success_at,
            max_concurrency=self.max_concurrency,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


class _Toggled(NamedTuple):
    """A row of ``endpoint_disable`` and ``endpoint_enable``: whether the endpoint
    was found, and how many of its messages were paused or resumed."""

    found: int
    moved: int
    notified: None = None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _check_metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidMessage("metadata", "must be a mapping")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage("metadata", f"is not JSON serialisable ({exc})") from None
    return dict(metadata)


def _check_max_concurrency(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
        raise InvalidMessage("max_concurrency", "must be an integer between 1 and 10000")
    return value


def _check_description(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise InvalidMessage("description", f"must be a string of at most {MAX_DESCRIPTION}")
    return value


class Endpoints:
    """Manage webhook endpoints in ``schema``."""

    def __init__(self, *, schema: str = DEFAULT_SCHEMA) -> None:
        self.queries: Queries = queries_for(schema)

    def add(
        self,
        tx: Any,
        *,
        url: str,
        event_types: Iterable[str] | None = None,
        secret: str | None = None,
        description: str = "",
        metadata: Mapping[str, Any] | None = None,
        max_concurrency: int | None = None,
    ) -> Endpoint:
        """Create an endpoint; a ``whsec_`` secret is generated unless given."""
        params = {
            "url": check_url(url),
            "event_types": check_subscriptions(event_types),
            "secret": check_secret(secret) if secret is not None else generate_secret(),
            "description": _check_description(description),
            "metadata": json.dumps(_check_metadata(metadata)),
            "max_concurrency": _check_max_concurrency(max_concurrency),
        }
        return run_sync(tx, self._insert_plan(params))

    def _insert_plan(self, params: dict[str, Any]) -> Plan[Endpoint]:
        ids: list[int] = yield self.queries["endpoint_insert"], params, scalar
        endpoint_id = ids[0]
        yield self.queries["endpoint_slots_sync"], {"id": endpoint_id}, None
        rows: list[_EndpointRow] = yield (
            self.queries["endpoint_get"],
            {"id": endpoint_id},
            _EndpointRow,
        )
        return rows[0].endpoint()

    def get(self, tx: Any, endpoint_id: int) -> Endpoint | None:
        """The endpoint, or None if there is no such id."""
        return run_sync(tx, self._get_plan(endpoint_id))

    def _get_plan(self, endpoint_id: int) -> Plan[Endpoint | None]:
        rows: list[_EndpointRow] = yield (
            self.queries["endpoint_get"],
            {"id": endpoint_id},
            _EndpointRow,
        )
        return rows[0].endpoint() if rows else None

    def require(self, tx: Any, endpoint_id: int) -> Endpoint:
        """The endpoint; raises InvalidArgument naming ``endpoint_id`` if absent."""
        found = self.get(tx, endpoint_id)
        if found is None:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        return found

    def all(self, tx: Any) -> list[Endpoint]:
        """Every endpoint, by id."""
        return run_sync(tx, self._list_plan())

    def _list_plan(self) -> Plan[list[Endpoint]]:
        rows: list[_EndpointRow] = yield self.queries["endpoint_list"], {}, _EndpointRow
        return [r.endpoint() for r in rows]

    def update(
        self,
        tx: Any,
        endpoint_id: int,
        *,
        url: str | None = None,
        event_types: Iterable[str] | None = None,
        description: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        max_concurrency: int | None = None,
        clear_max_concurrency: bool = False,
    ) -> Endpoint:
        """Change the given fields; the others keep their value."""
        changes: dict[str, Any] = {}
        if url is not None:
            changes["url"] = check_url(url)
        if event_types is not None:
            changes["event_types"] = check_subscriptions(event_types)
        if description is not None:
            changes["description"] = _check_description(description)
        if metadata is not None:
            changes["metadata"] = _check_metadata(metadata)
        if max_concurrency is not None:
            changes["max_concurrency"] = _check_max_concurrency(max_concurrency)
        elif clear_max_concurrency:
            changes["max_concurrency"] = None
        return run_sync(tx, self._update_plan(endpoint_id, changes, rotate=None))

    def rotate_secret(
        self,
        tx: Any,
        endpoint_id: int,
        *,
        secret: str | None = None,
        overlap: timedelta = DEFAULT_ROTATION_OVERLAP,
    ) -> Endpoint:
        """Sign with a new secret from now on; the previous ones keep signing for
        ``overlap`` (so receivers can switch), then are dropped."""
        new = check_secret(secret) if secret is not None else generate_secret()
        if overlap < timedelta(0):
            raise InvalidArgument("overlap", "must not be negative")
        return run_sync(tx, self._update_plan(endpoint_id, {}, rotate=(new, overlap)))

    def _update_plan(
        self, endpoint_id: int, changes: dict[str, Any], rotate: tuple[str, timedelta] | None
    ) -> Plan[Endpoint]:
        locked = yield self.queries["endpoint_lock"], {"id": endpoint_id}, None
        if not locked:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        rows: list[_EndpointRow] = yield (
            self.queries["endpoint_get"],
            {"id": endpoint_id},
            _EndpointRow,
        )
        current = rows[0].endpoint()
        params = {
            "id": endpoint_id,
            "url": changes.get("url", current.url),
            "event_types": changes.get("event_types", current.event_types),
            "description": changes.get("description", current.description),
            "metadata": json.dumps(changes.get("metadata", current.metadata)),
            "max_concurrency": changes.get("max_concurrency", current.max_concurrency),
        }
        yield self.queries["endpoint_update"], params, None
        if rotate is not None:
            new, overlap = rotate
            now = rows[0].now
            retired = [
                row_id
                for row_id, s in rows[0].stored_secrets()
                if (s.expires_at is not None and s.expires_at <= now) or s.secret == new
            ]
            yield (
                self.queries["endpoint_secret_rotate"],
                {"id": endpoint_id, "secret": new, "retired": retired, "until": now + overlap},
                None,
            )
        yield self.queries["endpoint_slots_sync"], {"id": endpoint_id}, None
        rows = yield self.queries["endpoint_get"], {"id": endpoint_id}, _EndpointRow
        return rows[0].endpoint()

    def disable(self, tx: Any, endpoint_id: int, *, reason: str = "disabled by an operator") -> int:
        """Disable the endpoint and pause its waiting messages; return how many."""
        if not isinstance(reason, str) or not reason or len(reason) > MAX_DESCRIPTION:
            raise InvalidMessage("reason", "must be a non-empty string")
        return run_sync(tx, self._toggle_plan("endpoint_disable", endpoint_id, reason))

    def enable(self, tx: Any, endpoint_id: int, *, notify: bool = True) -> int:
        """Enable the endpoint, clear its failure streak and resume its paused
        messages; return how many resumed."""
        name = "endpoint_enable_notify" if notify else "endpoint_enable"
        return run_sync(tx, self._toggle_plan(name, endpoint_id, None))

    def _toggle_plan(self, name: str, endpoint_id: int, reason: str | None) -> Plan[int]:
        rows: list[_Toggled] = yield (
            self.queries[name],
            {"id": endpoint_id, "reason": reason},
            _Toggled,
        )
        if not rows[0].found:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        return rows[0].moved

    def delete(self, tx: Any, endpoint_id: int) -> int:
        """Delete the endpoint; its waiting messages become dead. Returns how many
        messages it had (delivered history is kept)."""
        return run_sync(tx, self._delete_plan(endpoint_id))

    def _delete_plan(self, endpoint_id: int) -> Plan[int]:
        detached = yield self.queries["endpoint_detach"], {"id": endpoint_id}, None
        rows = yield self.queries["endpoint_delete"], {"id": endpoint_id}, None
        if not rows:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        return len(detached)
