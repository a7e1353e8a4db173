"""OAuth2 tokens' pure logic: client authentication, lifetimes, the cache's keys,
single flight and the failure hold, on a scripted client and a fake clock.

The requests themselves, against real servers, are in tests/delivery/test_oauth2.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import replace
from urllib.parse import unquote_plus

import pytest

from dispatchers.delivery import oauth2
from dispatchers.delivery.auth import ClientCredentials
from dispatchers.delivery.oauth2 import (
    DEFAULT_LIFETIME,
    FAILURE_HOLD,
    Tokens,
    TokenUnavailable,
    basic_authorization,
    fingerprint,
    refresh_after,
    shown,
)
from dispatchers.delivery.outcome import Verdict
from tests.docs import page, prose
from tests.timing import LATE
from tests.waiting import until

CREDENTIALS = ClientCredentials(
    token_url="https://auth.example/token",
    client_id="dispatcher 1:a",
    client_secret="s3cr3t+/=&ü",
    scope="deliver",
    audience=None,
)


NO_TOKEN = "answered no valid access_token"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TokenEndpoint:
    """An :class:`~dispatchers.delivery.http.HttpClient` that answers token requests
    with ``reply`` (a JSON document, or bytes as they are), ``status``; it counts
    them, and while ``gate`` is clear, they wait for it."""

    def __init__(self) -> None:
        self.status = 200
        self.reply: object = {"access_token": "tok", "token_type": "Bearer"}
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        read_limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        assert read_limit == oauth2.RESPONSE_LIMIT
        self.requests.append((url, dict(headers), body))
        await self.gate.wait()
        reply = self.reply
        if isinstance(reply, dict):
            reply = {**reply, "access_token": f"{reply['access_token']}-{len(self.requests)}"}
        data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
        return self.status, {}, data

    async def aclose(self) -> None:
        return None


def tokens(endpoint: TokenEndpoint, clock: Clock) -> Tokens:
    return Tokens(endpoint, timeout=5.0, clock=clock)


def test_client_secret_basic_form_urlencodes_id_and_secret_before_base64() -> None:
    value = basic_authorization("dispatcher 1:a", "s3cr3t+/=&ü")
    scheme, encoded = value.split(" ")
    assert scheme == "Basic"
    pair = base64.b64decode(encoded).decode("ascii")
    assert pair == "dispatcher+1%3Aa:s3cr3t%2B%2F%3D%26%C3%BC"
    client_id, _, secret = pair.partition(":")  # one colon left: the separator
    assert (unquote_plus(client_id), unquote_plus(secret)) == ("dispatcher 1:a", "s3cr3t+/=&ü")


def test_a_token_is_replaced_a_tenth_of_its_lifetime_early_at_most_30_s() -> None:
    assert refresh_after(2) == pytest.approx(1.8)
    assert refresh_after(60) == pytest.approx(54)
    assert refresh_after(3600) == 3570


def test_every_field_of_the_credentials_makes_another_key_and_none_is_kept() -> None:
    variants = [
        replace(CREDENTIALS, token_url="https://auth.example/other"),
        replace(CREDENTIALS, client_id="dispatcher 2"),
        replace(CREDENTIALS, client_secret="rotated"),
        replace(CREDENTIALS, scope=None),
        replace(CREDENTIALS, scope=""),
        replace(CREDENTIALS, audience="https://api"),
    ]
    prints = {fingerprint(CREDENTIALS), *map(fingerprint, variants)}
    assert len(prints) == len(variants) + 1
    assert fingerprint(replace(CREDENTIALS)) == fingerprint(CREDENTIALS)
    assert CREDENTIALS.client_secret not in repr(CREDENTIALS)


def test_errors_show_the_token_url_without_user_info_or_query() -> None:
    assert shown("https://user:pw@auth.example:8443/t?key=k#f") == "https://auth.example:8443/t"


async def test_concurrent_callers_share_one_fetch_and_then_the_cached_token() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    cache = tokens(endpoint, clock)
    endpoint.gate.clear()
    waiting = [asyncio.create_task(cache.token(1, CREDENTIALS)) for _ in range(64)]
    await asyncio.sleep(0)  # every caller reaches the fetch (the gate holds it)
    endpoint.gate.set()
    assert set(await asyncio.gather(*waiting)) == {"tok-1"}
    assert await cache.token(1, CREDENTIALS) == "tok-1"
    assert len(endpoint.requests) == cache.fetches == 1
    ((url, headers, body),) = endpoint.requests
    assert url == CREDENTIALS.token_url
    assert headers["Authorization"] == basic_authorization("dispatcher 1:a", "s3cr3t+/=&ü")
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert body == b"grant_type=client_credentials&scope=deliver"
    assert CREDENTIALS.client_secret not in repr(vars(cache))


async def test_a_token_without_expires_in_lasts_the_default_lifetime() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    cache = tokens(endpoint, clock)
    assert await cache.token(1, CREDENTIALS) == "tok-1"
    clock.now += refresh_after(DEFAULT_LIFETIME) - 0.001
    assert await cache.token(1, CREDENTIALS) == "tok-1"
    clock.now += 0.001
    assert await cache.token(1, CREDENTIALS) == "tok-2"


@pytest.mark.parametrize(("expires_in", "lasts"), [(120, 108.0), ("120", 108.0), (0.5, 0.45)])
async def test_expires_in_as_a_number_or_a_string_of_digits(
    expires_in: object, lasts: float
) -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    endpoint.reply = {"access_token": "tok", "token_type": "bearer", "expires_in": expires_in}
    cache = tokens(endpoint, clock)
    await cache.token(1, CREDENTIALS)
    clock.now += lasts - 0.01
    assert await cache.token(1, CREDENTIALS) == "tok-1"
    clock.now += 0.01
    assert await cache.token(1, CREDENTIALS) == "tok-2"


async def test_an_expires_in_past_any_float_is_a_long_lifetime() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    endpoint.reply = {"access_token": "tok", "token_type": "Bearer", "expires_in": 10**400}
    cache = tokens(endpoint, clock)
    await cache.token(1, CREDENTIALS)
    clock.now += 365 * 24 * 3600
    assert await cache.token(1, CREDENTIALS) == "tok-1"


@pytest.mark.parametrize("expires_in", [0, -5, True, "3600s", "", [], float("nan")])
async def test_an_invalid_expires_in_is_no_token(expires_in: object) -> None:
    endpoint = TokenEndpoint()
    endpoint.reply = {"access_token": "tok", "token_type": "Bearer", "expires_in": expires_in}
    with pytest.raises(TokenUnavailable, match=r"answered an invalid expires_in$"):
        await tokens(endpoint, Clock()).token(1, CREDENTIALS)


async def test_a_failure_is_shared_then_held_and_never_cached_as_a_token() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    endpoint.status = 503
    endpoint.reply = b"down"
    cache = tokens(endpoint, clock)
    endpoint.gate.clear()
    waiting = [asyncio.create_task(cache.token(1, CREDENTIALS)) for _ in range(64)]
    await asyncio.sleep(0)
    endpoint.gate.set()
    failures = await asyncio.gather(*waiting, return_exceptions=True)
    assert {type(f) for f in failures} == {TokenUnavailable}
    assert {str(f) for f in failures} == {
        "OAuth2 token endpoint https://auth.example/token answered 503"
    }
    outcome = failures[0].outcome  # type: ignore[union-attr]
    assert (outcome.verdict, outcome.error_class, outcome.status) == (Verdict.RETRY, "oauth2", None)
    clock.now += FAILURE_HOLD - 0.001
    with pytest.raises(TokenUnavailable):
        await cache.token(1, CREDENTIALS)
    assert len(endpoint.requests) == 1  # held: not asked again
    endpoint.status = 200
    endpoint.reply = {"access_token": "tok", "token_type": "Bearer"}
    clock.now += 0.001
    assert await cache.token(1, CREDENTIALS) == "tok-2"


async def test_changed_credentials_fetch_anew_and_replace_the_old_entry() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    cache = tokens(endpoint, clock)
    assert await cache.token(1, CREDENTIALS) == "tok-1"
    assert await cache.token(2, CREDENTIALS) == "tok-2"  # another endpoint, its own
    rotated = replace(CREDENTIALS, client_secret="rotated")
    assert await cache.token(1, rotated) == "tok-3"
    assert len(cache) == 2
    assert await cache.token(1, rotated) == "tok-3"


async def test_invalidating_drops_only_the_token_still_cached() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    cache = tokens(endpoint, clock)
    old = await cache.token(1, CREDENTIALS)
    cache.invalidate(1, CREDENTIALS, old)
    new = await cache.token(1, CREDENTIALS)
    assert (old, new) == ("tok-1", "tok-2")
    for _ in range(63):  # the other requests refused with the old token
        cache.invalidate(1, CREDENTIALS, old)
        assert await cache.token(1, CREDENTIALS) == "tok-2"
    assert cache.fetches == 2


@pytest.mark.parametrize(
    ("status", "reply", "error"),
    [
        (
            400,
            {"error": "invalid_client", "error_description": "s3cr3t is wrong"},
            "answered 400 (invalid_client)",
        ),
        (401, {"error": "bad code with spaces"}, "answered 401"),
        (302, b"", "answered 302 (a redirect, not followed)"),
        (200, b"<html>", "answered 200 without a JSON object"),
        (200, b"[" * 50_000, "answered 200 without a JSON object"),
        (200, {"token_type": "Bearer"}, NO_TOKEN),
        (200, {"access_token": "a b", "token_type": "Bearer"}, NO_TOKEN),
        (200, {"access_token": "t\r\nX: 1", "token_type": "Bearer"}, NO_TOKEN),
        (200, {"access_token": "t", "token_type": "mac"}, "answered token_type 'mac', not Bearer"),
        (200, {"access_token": "t"}, "answered token_type missing or invalid, not Bearer"),
        (200, b"x" * oauth2.RESPONSE_LIMIT, "answered more than 65536 bytes"),
    ],
)
async def test_each_bad_answer_has_its_reason(status: int, reply: object, error: str) -> None:
    endpoint = TokenEndpoint()
    endpoint.status = status
    endpoint.reply = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
    with pytest.raises(TokenUnavailable) as caught:
        await tokens(endpoint, Clock()).token(1, CREDENTIALS)
    assert str(caught.value) == f"OAuth2 token endpoint https://auth.example/token {error}"
    assert "s3cr3t" not in str(caught.value)


def test_the_docs_state_the_defaults_the_code_has() -> None:
    text = prose(page("how-to/endpoint-credentials.md"))
    heading = r"\*\*OAuth2\.\*\*"
    (paragraph,) = re.findall(heading + r".*?(?=\*\*|#|$)", text)
    assert f"{DEFAULT_LIFETIME / 60:g} minutes" in paragraph
    assert f"{oauth2.MARGIN:g} s or a tenth of its lifetime" in paragraph
    assert f"{FAILURE_HOLD:g} s before" in paragraph
    assert f"bounded read ({oauth2.RESPONSE_LIMIT // 1024} KiB)" in paragraph


class OldClient:
    """An HttpClient written before ``read_limit``, and one that answers no bytes."""

    def __init__(self) -> None:
        self.requests = 0

    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, Mapping[str, str], bytes]:
        self.requests += 1
        return 200, {}, b"{}"

    async def aclose(self) -> None:
        return None


class NoBytes(TokenEndpoint):
    async def request(
        self, *args: object, **kwargs: object
    ) -> tuple[int, Mapping[str, str], bytes]:
        self.requests.append(("", {}, b""))
        return 200, {}, None  # type: ignore[return-value]


async def test_an_error_of_our_own_is_a_held_failure_not_a_loop_of_fetches() -> None:
    old = OldClient()
    cache = Tokens(old, timeout=5.0, clock=Clock())  # type: ignore[arg-type]
    for _ in range(3):
        with pytest.raises(TokenUnavailable) as caught:
            await cache.token(1, CREDENTIALS)
    assert old.requests == 0
    outcome = caught.value.outcome
    assert (outcome.verdict, outcome.error_class) == (Verdict.RETRY, "internal_error")
    assert (
        outcome.error
        == "OAuth2 token endpoint https://auth.example/token: internal error: TypeError"
    )
    broken = NoBytes()
    cache = tokens(broken, Clock())
    for _ in range(3):
        with pytest.raises(TokenUnavailable, match=r"internal error: TypeError$"):
            await cache.token(1, CREDENTIALS)
    assert len(broken.requests) == 1


class Stubborn(TokenEndpoint):
    """A token endpoint that never answers, and whose request, once cancelled,
    goes on until ``released`` is set, whatever cancels it again: a client stuck
    in its own clean-up."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.clear()
        self.released = asyncio.Event()

    async def request(
        self, method: str, url: str, **kwargs: object
    ) -> tuple[int, Mapping[str, str], bytes]:
        try:
            return await super().request(method, url, **kwargs)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            while not self.released.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await self.released.wait()
            raise


async def test_closing_leaves_a_fetch_that_does_not_stop_behind_after_its_bound_saying_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = Stubborn()
    cache = tokens(endpoint, Clock())
    waiting = asyncio.create_task(cache.token(1, CREDENTIALS))
    closing = None
    try:
        await until(lambda: bool(endpoint.requests), "the token request under way")
        closing = asyncio.create_task(cache.aclose(within=0.2))
        await asyncio.wait([closing], timeout=0.2 + LATE)  # which cancels nothing
        assert closing.done(), "closing waited past its bound for a request that does not stop"
        assert len(cache) == 0
    finally:
        endpoint.released.set()
        async with asyncio.timeout(LATE):
            await asyncio.gather(waiting, *filter(None, [closing]), return_exceptions=True)
    assert waiting.cancelled()  # the caller's wait ended with its fetch
    (record,) = [r for r in caplog.records if r.name == oauth2.__name__]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "1 OAuth2 token request(s) still running 0.2 s after they were cancelled: left behind"
    )
