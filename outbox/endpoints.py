"""Webhook endpoints: where published events go, and the secrets that sign them.

All functions run in the caller's transaction and never commit. Given a
:class:`~outbox.sealing.Keyring`, secrets, the client private key and the
credentials are stored sealed; the private key is never opened here.
:class:`Endpoints` is the one way an endpoint is written: each change is a plan
that takes the row lock, writes, and reads the endpoint back.

The module stays whole: the plans share the row lock and the read-back that make
each change safe.

Design: docs/explanation/design/endpoints.md
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, NamedTuple, TypeVar

from outbox._arguments import check_id
from outbox._endpoint_auth import Auth, AuthChange, OAuth2ClientCredentials, open_auth, stored_auth
from outbox._endpoint_fields import (
    check_description,
    check_max_concurrency,
    check_metadata,
    check_subscriptions,
    check_tenant_id,
)
from outbox._endpoint_rows import Endpoint, EndpointRow, Secret, TenantDefaults
from outbox._endpoint_tls import Tls, TlsChange, stored_tls
from outbox._filters import check_filter
from outbox._message import check_url
from outbox._policy_fields import RateChange, changed_rate, check_rate_change, rate_fields
from outbox._queries import Queries, queries_for
from outbox._retry_schedule import check_retry_schedule
from outbox._storable import check_text
from outbox._transaction import Plan, rows_plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA, MAX_SPAN
from outbox.errors import InvalidArgument, InvalidMessage
from outbox.sealing import (
    CLIENT_KEY,
    ENDPOINT_AUTH,
    SIGNING_SECRET,
    Keyring,
    Sealed,
    seal_secret,
)
from outbox.secrets import check_secret, generate_secret

__all__ = [
    "DEFAULT_ROTATION_OVERLAP",
    "MAX_RESEAL_BATCH",
    "MAX_ROTATION_OVERLAP",
    "RESEAL_BATCH",
    "Endpoint",
    "Endpoints",
    "OAuth2ClientCredentials",
    "Secret",
]

DEFAULT_ROTATION_OVERLAP = timedelta(hours=24)
RESEAL_BATCH = 500
"""Signing secrets :meth:`Endpoints.reseal` seals per call (per transaction), by default."""
MAX_RESEAL_BATCH = 10_000
"""The most it seals per call."""
MAX_ROTATION_OVERLAP = timedelta(seconds=MAX_SPAN)
"""The longest a rotated secret keeps signing: the bound of every span."""

T = TypeVar("T")


class _StoredSecret(NamedTuple):
    """A row of ``secrets_to_reseal`` and ``client_keys_to_reseal``: a signing
    secret or a client key as stored."""

    id: int
    endpoint_id: int
    secret: str
    key_id: str | None


class _Toggled(NamedTuple):
    """A row of ``endpoint_disable`` and ``endpoint_enable``: whether the endpoint
    was found, and how many of its messages were paused or resumed."""

    found: int
    moved: int
    notified: None = None


class Endpoints:
    """Manage webhook endpoints in ``schema``.

    :param keyring: the keys that seal signing secrets at rest (see
        :mod:`outbox.sealing`): new secrets are sealed under its current key, and
        sealed ones are opened as they are read. Without one, secrets are stored
        in plain text, and reading a sealed one raises
        :class:`~outbox.sealing.SecretKeyMissing` naming its key.
    """

    def __init__(self, *, schema: str = DEFAULT_SCHEMA, keyring: Keyring | None = None) -> None:
        self.queries: Queries = queries_for(schema)
        self.keyring = keyring

    def _run(self, tx: Any, plan: Plan[T]) -> T:
        """``plan`` on ``tx``; a schema that is not migrated is :class:`SchemaNotMigrated`."""
        return run_sync(tx, plan, schema=self.queries.schema)

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
        rate_limit: float | None = None,
        burst: int | None = None,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        filter: str | None = None,
        retry_schedule: Iterable[float] | None = None,
        headers: Mapping[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        bearer_token: str | None = None,
        oauth2: OAuth2ClientCredentials | None = None,
        tenant: str | None = None,
    ) -> Endpoint:
        """Create an endpoint; a ``whsec_`` secret is generated unless given.

        ``tenant``: the external id of the tenant it belongs to (see
        :mod:`outbox.tenants`; one that does not exist is refused naming
        ``tenant``). It then gets only the events published for that tenant,
        and the tenant's rate limit and retry schedule are its own unless given
        here. An endpoint's tenant is fixed when it is created.

        ``ca_bundle``: PEM certificates its deliveries verify against instead of
        the system's roots. ``client_cert`` and ``client_key`` (together): the PEM
        client certificate and private key its deliveries present; the key is
        sealed when there is a keyring. ``filter`` is a JMESPath expression that
        an event's payload must pass for the endpoint to get it (see
        ``outbox._filters``); checked here, and refused as
        :class:`outbox.InvalidMessage` naming ``filter``. ``retry_schedule``
        lists the seconds before each retry of its messages (the last repeats;
        see :mod:`outbox._retry_schedule`).

        Its credentials, sealed with the keyring when there is one: ``headers``
        every delivery carries (none the outbox sets itself, refused naming the
        header), and at most one of ``basic_auth`` (``(user, password)``),
        ``bearer_token`` and ``oauth2`` (the dispatcher fetches the token).
        """
        params = {
            "url": check_url(url),
            "event_types": check_subscriptions(event_types),
            "description": check_description(description),
            "metadata": json.dumps(check_metadata(metadata)),
            "max_concurrency": check_max_concurrency(max_concurrency),
            **rate_fields(rate_limit, burst),
            "filter": _checked_filter(filter),
            "retry_schedule": check_retry_schedule(retry_schedule),
        }
        new = check_secret(secret) if secret is not None else generate_secret()
        _check_pem_texts(ca_bundle=ca_bundle, client_cert=client_cert, client_key=client_key)
        change = TlsChange.of(ca_bundle=ca_bundle, client_cert=client_cert, client_key=client_key)
        tls = None if change is None else change.applied_to(Tls(None, None, None))
        credentials = AuthChange.of(
            headers=headers, basic_auth=basic_auth, bearer_token=bearer_token, oauth2=oauth2
        )
        auth = None if credentials is None else credentials.applied_to(Auth())
        owner = None if tenant is None else check_tenant_id(tenant)
        return self._run(tx, self._insert_plan(params, new, tls, auth, owner))

    def _insert_plan(
        self,
        params: dict[str, Any],
        secret: str,
        tls: Tls | None,
        auth: Auth | None,
        tenant: str | None = None,
    ) -> Plan[Endpoint]:
        params = {**params, "tenant_id": None}
        if tenant is not None:
            found: list[TenantDefaults] = yield (
                self.queries["tenant_defaults"],
                {"external_id": tenant},
                TenantDefaults,
            )
            if not found:
                raise InvalidArgument("tenant", f"no tenant with id {tenant!r}")
            params = found[0].applied_to(params)
        ids: list[int] = yield self.queries["endpoint_insert"], params, scalar
        endpoint_id = ids[0]
        yield (
            self.queries["endpoint_secret_insert"],
            self._stored(secret, endpoint_id),
            None,
        )
        if tls is not None:
            stored = stored_tls(self.keyring, tls, endpoint_id)
            yield self.queries["endpoint_tls_update"], stored, None
        if auth is not None:
            yield (
                self.queries["endpoint_auth_update"],
                stored_auth(self.keyring, auth, endpoint_id),
                None,
            )
        yield self.queries["endpoint_slots_sync"], {"id": endpoint_id}, None
        rows: list[EndpointRow] = yield (
            self.queries["endpoint_get"],
            {"id": endpoint_id},
            EndpointRow,
        )
        return rows[0].endpoint(self.keyring)

    def _stored(self, secret: str, endpoint_id: int) -> dict[str, Any]:
        """The parameters that store ``secret`` for ``endpoint_id``: sealed when
        there is a keyring."""
        text, key_id = seal_secret(self.keyring, secret, endpoint_id=endpoint_id)
        return {"id": endpoint_id, "secret": text, "key_id": key_id}

    def get(self, tx: Any, endpoint_id: int) -> Endpoint | None:
        """The endpoint, or None if there is no such id."""
        return self._run(tx, self._get_plan(check_id(endpoint_id, "endpoint_id")))

    def _get_plan(self, endpoint_id: int) -> Plan[Endpoint | None]:
        rows: list[EndpointRow] = yield (
            self.queries["endpoint_get"],
            {"id": endpoint_id},
            EndpointRow,
        )
        return rows[0].endpoint(self.keyring) if rows else None

    def require(self, tx: Any, endpoint_id: int) -> Endpoint:
        """The endpoint; raises InvalidArgument naming ``endpoint_id`` if absent."""
        found = self.get(tx, endpoint_id)
        if found is None:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        return found

    def all(self, tx: Any, *, tenant: str | None = None) -> list[Endpoint]:
        """Every endpoint, by id; with ``tenant``, that tenant's only."""
        owner = None if tenant is None else check_tenant_id(tenant)
        return self._run(tx, self._list_plan(owner))

    def _list_plan(self, tenant: str | None = None) -> Plan[list[Endpoint]]:
        if tenant is None:
            statement, params = self.queries["endpoint_list"], {}
        else:
            statement, params = self.queries["endpoint_list_tenant"], {"tenant": tenant}
        rows: list[EndpointRow] = yield statement, params, EndpointRow
        return [r.endpoint(self.keyring) for r in rows]

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
        rate_limit: float | None = None,
        burst: int | None = None,
        clear_rate_limit: bool = False,
        ca_bundle: str | None = None,
        clear_ca_bundle: bool = False,
        client_cert: str | None = None,
        client_key: str | None = None,
        clear_client_cert: bool = False,
        filter: str | None = None,
        clear_filter: bool = False,
        retry_schedule: Iterable[float] | None = None,
        clear_retry_schedule: bool = False,
        headers: Mapping[str, str] | None = None,
        clear_headers: bool = False,
        basic_auth: tuple[str, str] | None = None,
        clear_basic_auth: bool = False,
        bearer_token: str | None = None,
        clear_bearer_token: bool = False,
        oauth2: OAuth2ClientCredentials | None = None,
        clear_oauth2: bool = False,
    ) -> Endpoint:
        """Change the given fields; the others keep their value. A new
        ``rate_limit`` without a ``burst`` gets the default burst.

        ``client_cert`` and ``client_key`` are given together; ``clear_ca_bundle``
        and ``clear_client_cert`` remove them (the system's roots, no client
        certificate); ``clear_filter`` removes the filter.

        ``headers`` replaces its static headers (``clear_headers`` removes
        them); ``basic_auth``, ``bearer_token`` or ``oauth2`` sets what sends
        ``Authorization``, refused while another one is set unless that one is
        cleared in the same call (``clear_basic_auth``, ``clear_bearer_token``,
        ``clear_oauth2``). Keeping some credentials while changing others opens
        them, so it needs the key they are sealed under.
        """
        changes: dict[str, Any] = {}
        if url is not None:
            changes["url"] = check_url(url)
        if event_types is not None:
            changes["event_types"] = check_subscriptions(event_types)
        if description is not None:
            changes["description"] = check_description(description)
        if metadata is not None:
            changes["metadata"] = check_metadata(metadata)
        if max_concurrency is not None:
            changes["max_concurrency"] = check_max_concurrency(max_concurrency)
        elif clear_max_concurrency:
            changes["max_concurrency"] = None
        changes["rate"] = check_rate_change(rate_limit, burst, clear=clear_rate_limit)
        if filter is not None:
            changes["filter"] = _checked_filter(filter)
        elif clear_filter:
            changes["filter"] = None
        if retry_schedule is not None:
            changes["retry_schedule"] = check_retry_schedule(retry_schedule)
        elif clear_retry_schedule:
            changes["retry_schedule"] = None
        _check_pem_texts(ca_bundle=ca_bundle, client_cert=client_cert, client_key=client_key)
        tls = TlsChange.of(
            ca_bundle=ca_bundle,
            clear_ca_bundle=clear_ca_bundle,
            client_cert=client_cert,
            client_key=client_key,
            clear_client_cert=clear_client_cert,
        )
        credentials = AuthChange.of(
            headers=headers,
            clear_headers=clear_headers,
            basic_auth=basic_auth,
            clear_basic_auth=clear_basic_auth,
            bearer_token=bearer_token,
            clear_bearer_token=clear_bearer_token,
            oauth2=oauth2,
            clear_oauth2=clear_oauth2,
        )
        endpoint_id = check_id(endpoint_id, "endpoint_id")
        return self._run(
            tx, self._update_plan(endpoint_id, changes, rotate=None, tls=tls, auth=credentials)
        )

    def rotate_secret(
        self,
        tx: Any,
        endpoint_id: int,
        *,
        secret: str | None = None,
        overlap: timedelta = DEFAULT_ROTATION_OVERLAP,
    ) -> Endpoint:
        """Sign with a new secret from now on; the previous ones keep signing for
        ``overlap`` (so receivers can switch; at most :data:`MAX_ROTATION_OVERLAP`),
        then are dropped."""
        new = check_secret(secret) if secret is not None else generate_secret()
        if not isinstance(overlap, timedelta):
            raise InvalidArgument("overlap", f"must be a timedelta, not {type(overlap).__name__}")
        if not timedelta(0) <= overlap <= MAX_ROTATION_OVERLAP:
            raise InvalidArgument("overlap", f"must be from 0 to {MAX_ROTATION_OVERLAP.days} days")
        endpoint_id = check_id(endpoint_id, "endpoint_id")
        return self._run(tx, self._update_plan(endpoint_id, {}, rotate=(new, overlap)))

    def _update_plan(
        self,
        endpoint_id: int,
        changes: dict[str, Any],
        rotate: tuple[str, timedelta] | None,
        tls: TlsChange | None = None,
        auth: AuthChange | None = None,
    ) -> Plan[Endpoint]:
        locked = yield self.queries["endpoint_lock"], {"id": endpoint_id}, None
        if not locked:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        rows: list[EndpointRow] = yield (
            self.queries["endpoint_get"],
            {"id": endpoint_id},
            EndpointRow,
        )
        current = rows[0].endpoint(self.keyring)
        # checked before anything is written: a second scheme is refused here
        credentials = (
            None
            if auth is None
            else auth.applied_to(open_auth(self.keyring, current.auth, endpoint_id))
        )
        params = {
            "id": endpoint_id,
            "url": changes.get("url", current.url),
            "event_types": changes.get("event_types", current.event_types),
            "description": changes.get("description", current.description),
            "metadata": json.dumps(changes.get("metadata", current.metadata)),
            "max_concurrency": changes.get("max_concurrency", current.max_concurrency),
            **changed_rate(
                RateChange(current.rate_limit_per_s, current.burst), changes.get("rate")
            ),
            "filter": changes.get("filter", current.filter),
            "retry_schedule": changes.get("retry_schedule", current.retry_schedule),
        }
        yield self.queries["endpoint_update"], params, None
        if tls is not None:
            stored = Tls(current.ca_bundle, current.client_cert, current.client_key)
            yield (
                self.queries["endpoint_tls_update"],
                stored_tls(self.keyring, tls.applied_to(stored), endpoint_id),
                None,
            )
        if credentials is not None:
            yield (
                self.queries["endpoint_auth_update"],
                stored_auth(self.keyring, credentials, endpoint_id),
                None,
            )
        if rotate is not None:
            new, overlap = rotate
            now = rows[0].now
            retired = [
                row_id
                for row_id, s in rows[0].stored_secrets(self.keyring)
                if (s.expires_at is not None and s.expires_at <= now) or s.secret == new
            ]
            params = {**self._stored(new, endpoint_id), "retired": retired, "until": now + overlap}
            yield self.queries["endpoint_secret_rotate"], params, None
        yield self.queries["endpoint_slots_sync"], {"id": endpoint_id}, None
        rows = yield self.queries["endpoint_get"], {"id": endpoint_id}, EndpointRow
        return rows[0].endpoint(self.keyring)

    def reseal(self, tx: Any, *, limit: int = RESEAL_BATCH) -> int:
        """Seal under the keyring's current key up to ``limit`` signing secrets,
        client keys and endpoints' credentials that are not (plain text, or
        sealed under an older key); return how many.

        Run it in transactions of their own until it returns 0: each batch's rows
        are locked until its transaction ends, so several may run at once, and
        dispatchers holding both keys sign with either form meanwhile. Raises
        :class:`~outbox.sealing.SecretKeyMissing` for a secret sealed under a key
        the keyring lacks (before writing anything of that batch).
        """
        if self.keyring is None:
            raise InvalidArgument("keyring", "resealing needs a keyring to seal with")
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidArgument("limit", f"must be an integer, not {type(limit).__name__}")
        if not 1 <= limit <= MAX_RESEAL_BATCH:
            raise InvalidArgument("limit", f"must be from 1 to {MAX_RESEAL_BATCH}")
        return self._run(tx, self._reseal_plan(self.keyring, limit))

    def _reseal_plan(self, keyring: Keyring, limit: int) -> Plan[int]:
        sealed = 0
        # signing secrets first, then the endpoints' client keys and credentials,
        # in one batch
        for select, write, kind in (
            ("secrets_to_reseal", "secrets_reseal", SIGNING_SECRET),
            ("client_keys_to_reseal", "client_keys_reseal", CLIENT_KEY),
            ("auth_to_reseal", "auth_reseal", ENDPOINT_AUTH),
        ):
            if sealed == limit:
                break
            rows: list[_StoredSecret] = yield (
                self.queries[select],
                {"key_id": keyring.current, "limit": limit - sealed},
                _StoredSecret,
            )
            secrets = [
                keyring.seal(
                    keyring.open(Sealed(r.secret, r.key_id), endpoint_id=r.endpoint_id, kind=kind),
                    endpoint_id=r.endpoint_id,
                    kind=kind,
                ).text
                for r in rows
            ]
            if rows:
                yield (
                    self.queries[write],
                    {"key_id": keyring.current, "ids": [r.id for r in rows], "secrets": secrets},
                    None,
                )
            sealed += len(rows)
        return sealed

    def unsealed(self, tx: Any) -> int:
        """How many signing secrets, client keys and endpoints' credentials are not
        sealed under the keyring's current key (every plain-text one, and without a keyring all)."""
        current = self.keyring.current if self.keyring is not None else None
        counts: list[int] = self._run(
            tx, rows_plan(self.queries["secrets_unsealed_count"], {"key_id": current}, scalar)
        )
        return counts[0]

    def disable(self, tx: Any, endpoint_id: int, *, reason: str = "disabled by an operator") -> int:
        """Disable the endpoint and pause its waiting messages; return how many."""
        if not reason:
            raise InvalidMessage("reason", "must be a non-empty string")
        reason = check_description(reason, "reason")
        endpoint_id = check_id(endpoint_id, "endpoint_id")
        return self._run(tx, self._toggle_plan("endpoint_disable", endpoint_id, reason))

    def enable(self, tx: Any, endpoint_id: int, *, notify: bool = True) -> int:
        """Enable the endpoint, clear its failure streak and resume its paused
        messages; return how many resumed."""
        name = "endpoint_enable_notify" if notify else "endpoint_enable"
        return self._run(tx, self._toggle_plan(name, check_id(endpoint_id, "endpoint_id"), None))

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
        return self._run(tx, self._delete_plan(check_id(endpoint_id, "endpoint_id")))

    def _delete_plan(self, endpoint_id: int) -> Plan[int]:
        detached = yield self.queries["endpoint_detach"], {"id": endpoint_id}, None
        rows = yield self.queries["endpoint_delete"], {"id": endpoint_id}, None
        if not rows:
            raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
        yield self.queries["endpoint_slots_sync"], {"id": endpoint_id}, None  # its rate slots
        return len(detached)


def _checked_filter(value: object) -> str | None:
    """A filter (see ``outbox._filters``), its text one PostgreSQL can store."""
    if isinstance(value, str):
        check_text(value, "filter")
    return check_filter(value)


def _check_pem_texts(**texts: object) -> None:
    """TLS material is text PostgreSQL can store (what else it must be,
    ``outbox._endpoint_tls`` checks): a NUL outside the PEM blocks would pass
    the ``ssl`` module and fail at the server."""
    for field, value in texts.items():
        if isinstance(value, str):
            check_text(value, field)
