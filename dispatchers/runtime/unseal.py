"""Opening what a claimed message carries sealed: its signing secrets, its
endpoint's TLS material and credentials, after the claim and outside the
database layer."""

from __future__ import annotations

from dispatchers.delivery.credentials import OpenedAuth
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.tls import TlsContexts
from dispatchers.delivery.unsealing import OpenedSecrets
from dispatchers.store.messages import Claimed
from outbox.sealing import Keyring


class Opener:
    """Makes the :class:`Job` of each claimed message, after the claim: opens its
    sealed signing secrets (:mod:`dispatchers.delivery.unsealing`), builds its
    endpoint's TLS context (:mod:`dispatchers.delivery.tls`) and opens its
    credentials (:mod:`dispatchers.delivery.credentials`), all with ``keyring``. A
    message whose secrets, client key or credentials cannot be opened gets a job
    that says why (``secrets_unavailable``): it is never sent unsigned, nor
    without them."""

    def __init__(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        self.secrets = OpenedSecrets(keyring)
        self.tls = TlsContexts(keyring)
        self.auth = OpenedAuth(keyring)

    def job(self, claimed: Claimed) -> Job:
        secrets, unavailable = self.secrets.open(
            claimed.endpoint_id, claimed.secrets, claimed.secret_keys
        )
        context, key_unavailable = self.tls.context(
            claimed.endpoint_id,
            claimed.ca_bundle,
            claimed.client_cert,
            claimed.client_key,
            claimed.client_key_id,
        )
        auth, auth_unavailable = self.auth.open(
            claimed.endpoint_id, claimed.auth, claimed.auth_key_id
        )
        unavailable = unavailable or key_unavailable or auth_unavailable
        return Job(
            id=claimed.id,
            idempotency_key=claimed.idempotency_key,
            url=claimed.url,
            method=claimed.method,
            headers=claimed.headers,
            body=claimed.body,
            content_type=claimed.content_type,
            attempts=claimed.attempts,
            max_attempts=claimed.max_attempts,
            endpoint_id=claimed.endpoint_id,
            event_type=claimed.event_type,
            created_at=claimed.created_at,
            destination=claimed.destination,
            retry_base=claimed.retry_base,
            secrets=secrets,
            ordering_key=claimed.ordering_key,
            trace_context=claimed.trace_context,
            retry_schedule=claimed.retry_schedule,
            probe=claimed.probe,
            tls=context,
            secrets_unavailable=unavailable,
            missing_keys=self._missing_keys(claimed) if unavailable else (),
            auth_headers=auth.headers or None,
            oauth2=auth.oauth2,
        )

    def _missing_keys(self, claimed: Claimed) -> tuple[str, ...]:
        """The keys the message's sealed values are under that ``keyring`` lacks."""
        used = {
            *(key_id for key_id in claimed.secret_keys or () if key_id is not None),
            *(key_id for key_id in (claimed.client_key_id, claimed.auth_key_id) if key_id),
        }
        if self._keyring is None:
            return tuple(sorted(used))
        return tuple(self._keyring.missing(used))
