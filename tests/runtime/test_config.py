"""Dispatcher settings are validated as a whole, naming the setting at fault."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from dispatchers.runtime.config import MAX_COUNT, MAX_SECONDS, DispatcherConfig, kind_of
from outbox.defaults import MAX_SPAN
from outbox.errors import ConfigurationError


def test_defaults_are_valid_and_keep_the_documented_budgets() -> None:
    config = DispatcherConfig()
    assert (config.lease, config.renew_interval) == (30.0, 10.0)
    assert (config.claim_timeout, config.statement_timeout, config.lock_timeout) == (2.0, 3.0, 1.0)
    assert config.idle_in_transaction_timeout == 5.0
    assert config.completion_budget == pytest.approx(10.0 + 0.05 + 3.0)


def test_lease_shorter_than_the_completion_budget_is_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigurationError) as info:
        DispatcherConfig(lease=30.0, request_timeout=20.0)
    message = str(info.value)
    assert message.startswith("lease: 30 s is too short")
    assert "request timeout (20 s)" in message
    assert "(34.575 s)" in message  # 1.5 x (20 + 0.05 + 3)


def test_lease_exactly_at_the_budget_is_accepted() -> None:
    config = DispatcherConfig(lease=1.5 * (8.0 + 0.05 + 3.0), request_timeout=8.0)
    assert config.lease == pytest.approx(16.575)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"batch_size": -1}, "batch_size"),
        ({"flush_batch": 0}, "flush_batch"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"poll_interval": float("nan")}, "poll_interval"),
        ({"connect_timeout": 11.0}, "connect_timeout"),
        ({"grace": -1.0}, "grace"),
        ({"lease": 60.0, "claim_timeout": 25.0}, "claim_timeout"),
        ({"idempotency_key_format": "quoted"}, "idempotency_key_format"),
        ({"allow_networks": ("10.0.0.1/8",)}, "allow_networks"),
        ({"allow_networks": ("not-a-cidr",)}, "allow_networks"),
        ({"schema": "bad-name"}, "schema"),
        ({"excerpt_bytes": 10**9}, "excerpt_bytes"),
        ({"disable_after": 0}, "disable_after"),
        ({"lease": math.inf}, "lease"),
        ({"lease": MAX_SECONDS + 1}, "lease"),
        ({"grace": math.nan}, "grace"),
        ({"grace": math.inf}, "grace"),
        ({"poll_interval": 1e308}, "poll_interval"),
        ({"retention": MAX_SPAN * 2}, "retention"),
        ({"disable_after": math.inf}, "disable_after"),
        ({"concurrency": MAX_COUNT + 1}, "concurrency"),
        ({"concurrency": 10**400}, "concurrency"),
        ({"flush_interval": 10**400}, "flush_interval"),
        ({"destination_concurrency": 0}, "destination_concurrency"),
        ({"destination_concurrency": True}, "destination_concurrency"),
        ({"destination_concurrency": 2.5}, "destination_concurrency"),
    ],
)
@pytest.mark.slow
def test_each_bad_setting_is_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{field}: "):
        DispatcherConfig(**overrides)


@pytest.mark.parametrize(
    ("concurrency", "destination_concurrency", "bound"),
    [
        (64, None, 48),
        (16, None, 12),
        (4, None, 3),
        (3, None, 2),
        (2, None, 1),
        (1, None, 1),
        (64, 64, 64),
        (8, 2, 2),
    ],
)
def test_the_bound_per_destination_leaves_a_quarter_of_the_slots_unless_set(
    concurrency: int, destination_concurrency: int | None, bound: int
) -> None:
    config = DispatcherConfig(
        concurrency=concurrency, destination_concurrency=destination_concurrency
    )
    assert config.per_destination == bound


@pytest.mark.parametrize(
    "schema", ["information_schema", "INFORMATION_SCHEMA", "pg_catalog", "pg_toast", "Pg_mine"]
)
def test_postgresqls_own_schemas_are_refused(schema: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^schema: '{schema}' is PostgreSQL's own"):
        DispatcherConfig(schema=schema)


def test_the_public_schema_is_the_users_and_allowed() -> None:
    assert DispatcherConfig(schema="public").schema == "public"


def _settings_of(*values: str) -> list[tuple[str, str]]:
    return [
        (setting.name, kind)
        for setting in dataclasses.fields(DispatcherConfig)
        if (kind := kind_of(setting)) in values and setting.default is not None
    ]


DISPATCHER_FIELDS = {setting.name: setting for setting in dataclasses.fields(DispatcherConfig)}


def test_every_number_setting_says_what_it_holds() -> None:
    # its kind is what validate() checks it by: a number without one goes unchecked
    numbers = {
        setting.name
        for setting in dataclasses.fields(DispatcherConfig)
        if setting.type in ("int", "float", "int | None", "float | None")
    }
    unkinded = {name for name in numbers if kind_of(DISPATCHER_FIELDS[name]) is None}
    assert unkinded == {"excerpt_bytes"}  # checked against max_response_bytes instead


@pytest.mark.parametrize(
    ("name", "kind"), _settings_of("count", "seconds", "seconds_or_zero", "span")
)
def test_each_setting_is_held_to_the_bounds_of_its_kind(name: str, kind: str) -> None:
    most = {"count": MAX_COUNT, "seconds": MAX_SECONDS, "seconds_or_zero": MAX_SECONDS}
    too_small = 0 if kind in ("count", "seconds", "span") else -1
    for value in (too_small, most.get(kind, MAX_SPAN) + 1):
        with pytest.raises(ConfigurationError, match=rf"^{name}: "):
            DispatcherConfig(**{name: value})


def test_the_guard_admits_loopback_on_the_embedded_database_only() -> None:
    assert DispatcherConfig().allowed_networks == ()
    assert DispatcherConfig().ssrf_guard.startswith("on: public addresses only")
    embedded = DispatcherConfig(embedded_database=True, allow_networks=("10.0.0.0/8",))
    assert embedded.allowed_networks == ("10.0.0.0/8", "127.0.0.0/8", "::1/128")
    assert "embedded development database" in embedded.ssrf_guard
    assert DispatcherConfig(allow_private_networks=True).ssrf_guard.startswith("off")
