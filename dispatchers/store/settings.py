"""What the store reads of a dispatcher's settings.

The settings themselves belong to the runtime (:class:`~dispatchers.runtime.config.
DispatcherConfig`, which has every one of these); the store names only the ones it
uses, so that it depends on nothing above it. Times are in seconds.
"""

from __future__ import annotations

from typing import Protocol

from outbox.sealing import Keyring


class StoreSettings(Protocol):
    """The settings of a :class:`~dispatchers.store.postgres.Store` and of the
    preflight (:func:`~dispatchers.store.preflight.check_database`)."""

    @property
    def schema(self) -> str: ...
    @property
    def statement_timeout(self) -> float: ...
    @property
    def claim_timeout(self) -> float: ...
    @property
    def lock_timeout(self) -> float: ...
    @property
    def idle_in_transaction_timeout(self) -> float: ...
    @property
    def db_connect_timeout(self) -> float: ...
    @property
    def prepared_statements(self) -> bool: ...
    @property
    def lease(self) -> float: ...
    @property
    def per_destination(self) -> int: ...
    @property
    def disable_after(self) -> float: ...
    @property
    def retention(self) -> float: ...
    @property
    def keyring(self) -> Keyring | None: ...
