"""An endpoint's TLS material, checked before it is written, and the contexts the
dispatcher builds of it, once per endpoint and stored value."""

from __future__ import annotations

import pytest
import trustme

from dispatchers.delivery.tls import TlsContexts
from outbox._endpoint_tls import Tls, TlsChange, check_ca_bundle, check_client_cert, stored_tls
from outbox.errors import InvalidArgument
from outbox.sealing import CLIENT_KEY, Keyring, SealBroken, Sealed, generate_key, parse_keys


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def pair(ca: trustme.CA) -> tuple[str, str]:
    issued = ca.issue_cert("dispatcher.example")
    return issued.cert_chain_pems[0].bytes().decode(), issued.private_key_pem.bytes().decode()


def test_good_material_is_kept_as_given(ca: trustme.CA) -> None:
    bundle = ca.cert_pem.bytes().decode()
    cert, key = pair(ca)
    assert check_ca_bundle(bundle) == bundle
    assert check_client_cert(cert, key) == (cert, key)


@pytest.mark.parametrize(
    ("make", "field", "problem"),
    [
        (lambda cert, key, other: check_ca_bundle("no PEM here"), "ca_bundle", "no PEM"),
        (lambda cert, key, other: check_ca_bundle(cert + key), "ca_bundle", "private key"),
        (lambda cert, key, other: check_client_cert(cert + key, key), "client_cert", "private"),
        (lambda cert, key, other: check_client_cert("junk", key), "client_cert", "no PEM"),
        (lambda cert, key, other: check_client_cert(cert, cert), "client_key", "unencrypted"),
        (lambda cert, key, other: check_client_cert(cert, other), "client_key", "matches"),
        (
            lambda cert, key, other: check_client_cert(
                cert, key.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY")
            ),
            "client_key",
            "unencrypted",
        ),
    ],
)
def test_bad_material_is_refused_naming_its_field(
    ca: trustme.CA, make: object, field: str, problem: str
) -> None:
    cert, key = pair(ca)
    _, other = pair(ca)
    with pytest.raises(InvalidArgument, match=problem) as refused:
        make(cert, key, other)  # type: ignore[operator]
    assert refused.value.field == field


def test_a_change_needs_a_certificate_and_key_together_and_no_contradiction(
    ca: trustme.CA,
) -> None:
    cert, key = pair(ca)
    bundle = ca.cert_pem.bytes().decode()
    for arguments, field in [
        ({"client_cert": cert}, "client_key"),
        ({"client_key": key}, "client_cert"),
        ({"ca_bundle": bundle, "clear_ca_bundle": True}, "clear_ca_bundle"),
        ({"client_cert": cert, "client_key": key, "clear_client_cert": True}, "clear_client_cert"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            TlsChange.of(**arguments)  # type: ignore[arg-type]
        assert refused.value.field == field
    assert TlsChange.of() is None
    current = Tls(bundle, cert, key)
    clear_bundle = TlsChange.of(clear_ca_bundle=True)
    clear_cert = TlsChange.of(clear_client_cert=True)
    assert clear_bundle is not None and clear_cert is not None
    assert clear_bundle.applied_to(current) == Tls(None, cert, key)
    assert clear_cert.applied_to(current) == Tls(bundle, None, None)


def test_a_context_is_built_once_per_endpoint_and_stored_value(ca: trustme.CA) -> None:
    keyring = Keyring(parse_keys(generate_key(), "key"))
    cert, key = pair(ca)
    bundle = ca.cert_pem.bytes().decode()
    stored = stored_tls(keyring, Tls(bundle, cert, key), endpoint_id=7)
    assert stored["client_key_id"] == keyring.current and "PRIVATE" not in stored["client_key"]
    material = (bundle, cert, stored["client_key"], stored["client_key_id"])

    contexts = TlsContexts(keyring)
    first, problem = contexts.context(7, *material)
    assert first is not None and problem is None
    assert contexts.context(7, *material) == (first, None)
    for_8 = stored_tls(keyring, Tls(bundle, cert, key), endpoint_id=8)
    other, _ = contexts.context(8, bundle, cert, for_8["client_key"], for_8["client_key_id"])
    assert other is not None and other is not first  # never shared between endpoints
    assert contexts.built == 2
    assert contexts.context(7, None, None, None, None) == (None, None)


def test_a_key_that_does_not_open_holds_the_message_back(ca: trustme.CA) -> None:
    keyring = Keyring(parse_keys(generate_key(), "key"))
    cert, key = pair(ca)
    stored = stored_tls(keyring, Tls(None, cert, key), endpoint_id=7)
    material = (None, cert, stored["client_key"], stored["client_key_id"])
    context, problem = TlsContexts(None).context(7, *material)
    assert context is None and f"sealed under key {keyring.current}" in (problem or "")
    context, problem = TlsContexts(keyring).context(8, *material)  # sealed for endpoint 7
    assert context is None and "does not open" in (problem or "")


def test_a_sealed_client_key_does_not_open_as_a_signing_secret(ca: trustme.CA) -> None:
    keyring = Keyring(parse_keys(generate_key(), "key"))
    cert, key = pair(ca)
    stored = stored_tls(keyring, Tls(None, cert, key), endpoint_id=7)
    sealed = Sealed(stored["client_key"], stored["client_key_id"])
    assert keyring.open(sealed, endpoint_id=7, kind=CLIENT_KEY) == key
    with pytest.raises(SealBroken):
        keyring.open(sealed, endpoint_id=7)
