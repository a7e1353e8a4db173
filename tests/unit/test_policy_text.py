"""How delivery policies read to an operator: spans, rate limits and TLS material,
worded once for the commands and the dashboard."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from dispatchers.ui.policy_text import format_duration, rate_text, tls_fields
from outbox.endpoints import Endpoint
from outbox.sealing import Sealed

CA = "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nclient\n-----END CERTIFICATE-----\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def endpoint(**tls: object) -> Endpoint:
    now = datetime.now(UTC)
    return Endpoint(
        id=1,
        url="https://example.com/hook",
        description="",
        event_types=[],
        secrets=[],
        metadata={},
        enabled=True,
        disabled_reason=None,
        disabled_at=None,
        failure_streak=0,
        failing_since=None,
        last_success_at=None,
        max_concurrency=None,
        created_at=now,
        updated_at=now,
        **tls,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(604800, "7d"), (86400, "1d"), (5400, "90m"), (7200, "2h"), (60, "1m"), (90, "90s"),
     (0.5, "0.5s"), (0, "0s")],
)  # fmt: skip
def test_a_span_is_written_in_the_largest_unit_up_to_days_that_divides_it(
    seconds: float, text: str
) -> None:
    assert format_duration(seconds) == text


def test_a_rate_limit_reads_with_its_burst() -> None:
    assert rate_text(20.0, 10) == "20/s, burst 10"
    assert rate_text(0.5, 1) == "0.5/s, burst 1"
    assert rate_text(None, None) is None


def test_tls_material_reads_as_the_digests_of_its_certificates_and_where_its_key_is() -> None:
    sealed = endpoint(ca_bundle=CA, client_cert=CERT, client_key=Sealed("v1:...", "0123abcd"))
    assert tls_fields(sealed) == [
        ("CA bundle", f"sha256 {sha256(CA)}"),
        ("client cert", f"sha256 {sha256(CERT)}"),
        ("client key", "sealed under key 0123abcd"),
    ]
    plain = endpoint(client_cert=CERT, client_key=Sealed("-----BEGIN PRIVATE KEY-----", None))
    assert tls_fields(plain) == [
        ("CA bundle", None),
        ("client cert", f"sha256 {sha256(CERT)}"),
        ("client key", "stored in plain text"),
    ]
    assert tls_fields(endpoint(ca_bundle=CA)) == [
        ("CA bundle", f"sha256 {sha256(CA)}"),
        ("client cert", None),
        ("client key", None),
    ]
