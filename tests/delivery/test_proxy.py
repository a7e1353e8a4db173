"""The proxy setting: parsed once, its credentials kept out of every text."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from dispatchers.cli import build_parser
from dispatchers.cli._common import UsageError
from dispatchers.cli.dispatch import config_from_args
from dispatchers.delivery.proxy import Proxy
from dispatchers.delivery.ssrf import AddressPolicy, BlockedDestination, ProxiedDestinations
from dispatchers.runtime.config import DispatcherConfig
from outbox.errors import ConfigurationError


def test_a_proxy_url_keeps_its_credentials_apart_from_its_url() -> None:
    proxy = Proxy.parse("http://us%40er:p%3Ass@proxy.internal:3128/")
    assert proxy.url == "http://proxy.internal:3128"
    assert proxy.credentials == ("us@er", "p:ss")
    assert str(proxy) == "http://***@proxy.internal:3128"
    assert "p:ss" not in repr(proxy) and "p%3Ass" not in repr(proxy)
    assert "p%3Ass" not in repr(DispatcherConfig(proxy=proxy))


@pytest.mark.parametrize(
    ("text", "port"), [("http://10.0.0.8", 80), ("http://[fd00::8]:8080", 8080)]
)
def test_a_proxy_without_credentials_may_be_private_and_defaults_to_port_80(
    text: str, port: int
) -> None:
    proxy = Proxy.parse(text)
    assert proxy.credentials is None
    assert proxy.url.endswith(f":{port}") and str(proxy) == proxy.url


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("https://user:hunter2@proxy:3128", "must be an http:// URL"),
        ("socks5://user:hunter2@proxy:1080", "must be an http:// URL"),
        ("http://user:hunter2@proxy:99999", "invalid port"),
        ("http://user:hunter2@/", "names no host"),
        ("http://user:hunter2@proxy:3128/path", "no path, query or fragment"),
        ("user:hunter2@proxy:3128", "must be an http:// URL"),
    ],
)
def test_a_refused_proxy_url_is_named_with_its_credentials_masked(text: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as refused:
        Proxy.parse(text)
    assert "hunter2" not in str(refused.value)


def test_dispatch_takes_the_proxy_from_the_option_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    monkeypatch.setenv("OUTBOX_PROXY", "http://env-proxy:3128")
    assert str(config_from_args(parser.parse_args(["dispatch"])).proxy) == "http://env-proxy:3128"
    given = parser.parse_args(["dispatch", "--proxy", "http://u:p@flag-proxy:8080"])
    assert str(config_from_args(given).proxy) == "http://***@flag-proxy:8080"
    monkeypatch.setenv("OUTBOX_PROXY", "ftp://u:hunter2@env-proxy")
    with pytest.raises(UsageError, match="OUTBOX_PROXY") as refused:
        config_from_args(parser.parse_args(["dispatch"]))
    assert "hunter2" not in str(refused.value)
    monkeypatch.delenv("OUTBOX_PROXY")
    assert config_from_args(parser.parse_args(["dispatch"])).proxy is None


def test_a_refused_proxy_option_is_a_usage_error_without_its_credentials(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["dispatch", "--proxy", "https://u:hunter2@proxy"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--proxy" in err and "hunter2" not in err


async def test_a_destination_is_resolved_once_while_its_verdict_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    answers = {"public.example": "93.184.216.34", "private.example": "10.0.0.7"}
    looked_up: list[str] = []

    async def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        looked_up.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    destinations = ProxiedDestinations(AddressPolicy())
    for _ in range(3):
        await destinations.check("public.example", 443, within=1.0)
        with pytest.raises(BlockedDestination):
            await destinations.check("private.example", 443, within=1.0)
    # the allowed name once; the refused one every time (a refusal is never remembered)
    assert looked_up == ["public.example", *["private.example"] * 3]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("http://us%3Aer:hunter2@127.0.0.1:8888", "':' in its user name"),
        ("http://user:hunter2%ff@proxy:3128", "password that is not printable ASCII"),
        ("http://us%C3%A9r:hunter2@proxy:3128", "user name that is not printable ASCII"),
        ("http://user:hun%0D%0Ater2@proxy:3128", "password that is not printable ASCII"),
        ("http://user:hunter2@[::1", "is not a valid URL"),
        ("http://user:hunter2@127.1:3128", "non-canonical form"),
        ("http://user:hunter2@%31%32%37.0.0.1:3128", "must not percent-encode its host"),
        ("http://user:hunter2@pro xy:3128", "spaces, control or non-ASCII"),
        ("http://user:hunter2@proxy:0", "port 0"),
    ],
)
def test_a_proxy_either_client_would_refuse_at_start_is_refused_when_parsed(
    text: str, problem: str
) -> None:
    """aiohttp refuses a ':' in a Basic user name, httpx credentials outside ASCII,
    and both a host they cannot parse: once the dispatcher has started, with a
    traceback. Refused here, the credentials masked."""
    with pytest.raises(ConfigurationError, match=problem) as refused:
        Proxy.parse(text)
    assert "hunter2" not in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "credentials"),
    [
        ("http://us%40er:p%3Ass%20w%25@proxy:3128", ("us@er", "p:ss w%")),
        ("http://user:@proxy:3128", ("user", "")),
        ("http://user@proxy:3128", ("user", "")),
        ("http://user:a:b@proxy:3128", ("user", "a:b")),
    ],
)
def test_percent_encoded_credentials_are_decoded_once(
    text: str, credentials: tuple[str, str]
) -> None:
    assert Proxy.parse(text).credentials == credentials


def test_dispatch_refuses_a_proxy_whose_user_name_holds_a_colon_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["dispatch", "--proxy", "http://us%3Aer:pw@127.0.0.1:8888"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and "argument --proxy:" in err and "':' in its user name" in err
    assert "pw@" not in err
