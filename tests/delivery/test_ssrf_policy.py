"""AddressPolicy: which destination addresses the SSRF guard lets through."""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Network, ip_address

import pytest

from dispatchers.delivery.ssrf import AddressPolicy, BlockedDestination
from outbox.errors import ConfigurationError, OutboxError

NON_GLOBAL = [
    "127.0.0.1",  # loopback
    "127.255.255.254",
    "10.1.2.3",  # RFC 1918
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",  # link-local: cloud metadata
    "100.64.0.1",  # shared address space
    "0.0.0.0",  # unspecified
    "0.1.2.3",  # "this network"
    "255.255.255.255",  # limited broadcast
    "240.0.0.1",  # reserved
    "224.0.0.1",  # multicast
    "239.255.255.250",
    "192.0.0.8",  # IETF protocol assignments
    "192.0.2.1",  # documentation
    "198.51.100.7",
    "203.0.113.9",
    "198.18.0.1",  # benchmarking
    "::1",  # loopback
    "::",  # unspecified
    "fe80::1",  # link-local
    "fe80::1%eth0",  # link-local with a zone
    "fc00::1",  # unique local
    "fd12:3456::1",
    "fec0::1",  # deprecated site-local
    "ff02::1",  # multicast
    "100::1",  # discard-only
    "2001:db8::1",  # documentation
    "3fff::1",
    "2001::1",  # Teredo
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::a00:1",  # local-use NAT64 prefix
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
]

GLOBAL = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "172.32.0.1",  # just outside 172.16.0.0/12
    "100.128.0.1",  # just outside 100.64.0.0/10
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]


@pytest.mark.parametrize("text", NON_GLOBAL)
def test_default_policy_refuses_non_global_addresses(text: str) -> None:
    assert not AddressPolicy().is_allowed(ip_address(text))


@pytest.mark.parametrize("text", GLOBAL)
def test_default_policy_allows_global_unicast_addresses(text: str) -> None:
    assert AddressPolicy().is_allowed(ip_address(text))


@pytest.mark.parametrize("text", NON_GLOBAL + GLOBAL)
def test_allow_private_networks_allows_everything(text: str) -> None:
    assert AddressPolicy(allow_private_networks=True).is_allowed(ip_address(text))


def test_allow_list_permits_only_addresses_inside_its_cidrs() -> None:
    policy = AddressPolicy.from_strings(["10.0.0.0/8", "fd00::/8"])
    assert policy.is_allowed(ip_address("10.1.2.3"))
    assert policy.is_allowed(ip_address("fd12::1"))
    assert not policy.is_allowed(ip_address("127.0.0.1"))
    assert not policy.is_allowed(ip_address("192.168.1.1"))
    assert not policy.is_allowed(ip_address("fc00::1"))
    assert policy.is_allowed(ip_address("8.8.8.8"))


def test_allow_list_matches_the_ipv4_address_inside_an_ipv6_form() -> None:
    policy = AddressPolicy.from_strings(["127.0.0.0/8"])
    assert policy.is_allowed(ip_address("::ffff:127.0.0.1"))
    assert policy.is_allowed(ip_address("64:ff9b::7f00:1"))
    assert not policy.is_allowed(ip_address("::ffff:10.0.0.1"))
    assert not policy.is_allowed(ip_address("::1"))


def test_from_strings_parses_cidrs_and_single_addresses() -> None:
    policy = AddressPolicy.from_strings([" 10.0.0.0/8 ", "::1"], allow_private_networks=False)
    assert policy == AddressPolicy(allow=(IPv4Network("10.0.0.0/8"), IPv6Network("::1/128")))
    assert AddressPolicy.from_strings([], allow_private_networks=True).allow_private_networks


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "10.0.0.1/8", "not-a-cidr", "", "fe80::/129"])
def test_from_strings_rejects_bad_cidrs_naming_them(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid allow-list CIDR") as info:
        AddressPolicy.from_strings(["127.0.0.0/8", bad])
    assert repr(bad) in str(info.value)


def test_from_strings_rejects_a_bare_string() -> None:
    with pytest.raises(ConfigurationError, match="list of CIDRs"):
        AddressPolicy.from_strings("10.0.0.0/8")


def test_check_names_host_address_and_how_to_allow() -> None:
    with pytest.raises(BlockedDestination) as info:
        AddressPolicy().check("metadata.internal", ip_address("169.254.169.254"))
    message = str(info.value)
    assert "'metadata.internal'" in message
    assert "169.254.169.254" in message
    assert "--allow-private-networks" in message
    assert "allow-list" in message
    assert info.value.host == "metadata.internal"
    assert info.value.address == ip_address("169.254.169.254")
    assert isinstance(info.value, OutboxError)


def test_check_passes_allowed_addresses() -> None:
    AddressPolicy().check("example.com", ip_address("93.184.215.14"))
    AddressPolicy.from_strings(["127.0.0.0/8"]).check("localhost", ip_address("127.0.0.1"))
