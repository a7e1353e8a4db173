"""An endpoint's credentials as an operator reads them (``outbox endpoints show``
and the dashboard): the names of its static headers, what sets ``Authorization``,
how they are stored; never a value, password, token or secret."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatchers.ui.policy_text import auth_fields
from outbox.endpoints import Endpoint
from outbox.sealing import Sealed

SEALED = Sealed("v1:...", "0123abcd")
PLAIN = Sealed('{"password": "hunter2"}', None)


def endpoint(**credentials: object) -> Endpoint:
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
        **credentials,  # type: ignore[arg-type]
    )


def test_an_endpoint_without_credentials_reads_as_none() -> None:
    assert auth_fields(endpoint()) == [("credentials", None)]


def test_basic_credentials_name_the_user_and_the_key_that_seals_them() -> None:
    ep = endpoint(
        auth=SEALED, auth_scheme="basic", basic_username="alice", header_names=["X-A", "X-B"]
    )
    assert auth_fields(ep) == [
        ("headers", "X-A, X-B"),
        ("authorization", "basic, user alice"),
        ("credentials", "sealed under key 0123abcd"),
    ]


def test_a_bearer_token_stored_in_plain_text_reads_so() -> None:
    assert auth_fields(endpoint(auth=PLAIN, auth_scheme="bearer")) == [
        ("headers", None),
        ("authorization", "bearer token"),
        ("credentials", "stored in plain text"),
    ]


def test_static_headers_alone_set_no_authorization() -> None:
    assert auth_fields(endpoint(auth=SEALED, header_names=["X-Api-Key"])) == [
        ("headers", "X-Api-Key"),
        ("authorization", None),
        ("credentials", "sealed under key 0123abcd"),
    ]


@pytest.mark.parametrize(
    ("scope", "audience", "tail"),
    [
        (None, None, ""),
        ("read write", None, ", scope read write"),
        (None, "api", ", audience api"),
        ("read", "api", ", scope read, audience api"),
    ],
)
def test_oauth2_names_the_client_the_token_url_and_what_it_asks_for(
    scope: str | None, audience: str | None, tail: str
) -> None:
    ep = endpoint(
        auth=SEALED,
        auth_scheme="oauth2",
        oauth2_token_url="https://auth.example.com/token",
        oauth2_client_id="client-7",
        oauth2_scope=scope,
        oauth2_audience=audience,
    )
    assert auth_fields(ep)[1] == (
        "authorization",
        f"OAuth2 client credentials, client client-7 at https://auth.example.com/token{tail}",
    )
