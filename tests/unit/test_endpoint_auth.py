"""An endpoint's credentials as pure values: what a change makes of the current
ones, what the dispatcher sends of them, and what their reprs never show."""

from __future__ import annotations

import base64

import pytest

from dispatchers.delivery.auth import ClientCredentials
from dispatchers.delivery.credentials import OpenedAuth, endpoint_auth
from outbox._endpoint_auth import Auth, AuthChange, OAuth2ClientCredentials, stored_auth
from outbox.errors import InvalidMessage
from outbox.sealing import Keyring, Sealed, generate_key, parse_keys

CLIENT = OAuth2ClientCredentials("https://auth.example.com/t", "c1", "cs-secret", "s", None)


def change(**kwargs: object) -> AuthChange:
    made = AuthChange.of(**kwargs)  # type: ignore[arg-type]
    assert made is not None
    return made


def test_a_change_replaces_the_headers_and_keeps_the_scheme_unless_cleared() -> None:
    current = change(headers={"X-A": "1"}, basic_auth=("u", "p")).applied_to(Auth())
    assert current == Auth({"X-A": "1"}, ("u", "p"))
    assert change(headers={"X-B": "2"}).applied_to(current) == Auth({"X-B": "2"}, ("u", "p"))
    assert change(clear_headers=True).applied_to(current) == Auth({}, ("u", "p"))
    assert change(clear_bearer_token=True).applied_to(current) == current
    swapped = change(bearer_token="t", clear_basic_auth=True).applied_to(current)
    assert swapped == Auth({"X-A": "1"}, bearer="t")
    assert change(clear_basic_auth=True, clear_headers=True).applied_to(current).empty
    assert AuthChange.of() is None


def test_a_second_scheme_and_an_authorization_beside_one_are_refused() -> None:
    current = Auth({}, bearer="t")
    with pytest.raises(InvalidMessage) as refused:
        change(oauth2=CLIENT).applied_to(current)
    assert refused.value.field == "oauth2" and "clear_bearer_token" in refused.value.problem
    with pytest.raises(InvalidMessage) as refused:
        change(headers={"AUTHORIZATION": "x"}).applied_to(current)
    assert refused.value.field == "headers[AUTHORIZATION]"
    assert change(headers={"Authorization": "x"}).applied_to(Auth()).headers == {
        "Authorization": "x"
    }


def test_what_is_sent_basic_bearer_and_the_oauth2_client() -> None:
    basic = endpoint_auth(Auth({"X-A": "1"}, ("alice", "pä:ss")).to_json())
    pair = base64.b64encode("alice:pä:ss".encode()).decode()
    assert dict(basic.headers) == {"X-A": "1", "Authorization": f"Basic {pair}"}
    assert dict(endpoint_auth(Auth(bearer="t-1").to_json()).headers) == {
        "Authorization": "Bearer t-1"
    }
    oauth2 = endpoint_auth(Auth(oauth2=CLIENT).to_json())
    assert dict(oauth2.headers) == {}
    assert oauth2.oauth2 == ClientCredentials(
        "https://auth.example.com/t", "c1", "cs-secret", "s", None
    )


def test_no_repr_shows_a_secret() -> None:
    auth = Auth({"X-Api-Key": "k-secret"}, ("u", "p-secret"))
    shown = repr(auth) + repr(CLIENT) + repr(endpoint_auth(Auth(oauth2=CLIENT).to_json()).oauth2)
    assert "X-Api-Key" in shown and "c1" in shown
    assert not any(s in shown for s in ("k-secret", "p-secret", "cs-secret"))


def test_stored_credentials_open_once_per_value_and_only_for_their_endpoint() -> None:
    keyring = Keyring(parse_keys(generate_key(), "key"))
    stored = stored_auth(keyring, Auth({"X-A": "secret-1"}), endpoint_id=7)
    assert stored["auth_key_id"] == keyring.current and "secret-1" not in stored["auth"]
    assert stored["auth_header_names"] == ["X-A"] and stored["auth_scheme"] is None
    opened = OpenedAuth(keyring)
    first, problem = opened.open(7, stored["auth"], stored["auth_key_id"])
    assert problem is None and dict(first.headers) == {"X-A": "secret-1"}
    assert opened.open(7, stored["auth"], stored["auth_key_id"]) == (first, None)
    assert opened.opened == 1
    _, problem = opened.open(8, stored["auth"], stored["auth_key_id"])  # sealed for 7
    assert problem is not None and "do not open" in problem
    _, problem = OpenedAuth(None).open(7, stored["auth"], stored["auth_key_id"])
    assert problem is not None and keyring.current in problem
    # a signing secret's seal does not open as credentials, nor the reverse
    sealed = keyring.seal('{"headers": {}}', endpoint_id=7)
    _, problem = opened.open(7, sealed.text, sealed.key_id)
    assert problem is not None and isinstance(sealed, Sealed)
