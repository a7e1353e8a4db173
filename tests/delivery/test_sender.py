"""The sender's request building and response reading, on httpx.MockTransport."""

from __future__ import annotations

import httpx
from standardwebhooks.webhooks import Webhook

from dispatchers.delivery.http import Attempt, Sender, idempotency_header
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.outcome import Verdict
from dispatchers.runtime.config import DispatcherConfig
from outbox.secrets import generate_secret
from tests.jobs import job as make_job


def job(**overrides: object) -> Job:
    # a key with quotes, to check its RFC 8941 form
    return make_job(**{"idempotency_key": 'order-"7"', **overrides})


async def send(
    config: DispatcherConfig, message: Job, reply: httpx.Response
) -> tuple[list[httpx.Request], Attempt]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return reply

    sender = Sender(config, transport=httpx.MockTransport(handler))
    attempt = await sender.send(message)
    return seen, attempt


def test_idempotency_key_is_an_rfc8941_string_or_raw() -> None:
    assert idempotency_header('a"b\\c', "structured") == '"a\\"b\\\\c"'
    assert idempotency_header('a"b\\c', "raw") == 'a"b\\c'


async def test_request_carries_body_headers_and_key() -> None:
    (request,), attempt = await send(DispatcherConfig(), job(), httpx.Response(201, content=b"ok"))
    assert request.method == "POST"
    assert request.content == b'{"n":7}'
    assert request.headers["content-type"] == "application/json"
    assert request.headers["idempotency-key"] == '"order-\\"7\\""'
    assert request.headers["x-tenant"] == "acme"
    assert request.headers["accept-encoding"] == "identity"
    assert "webhook-signature" not in request.headers
    assert attempt.outcome.verdict is Verdict.DELIVERED
    assert attempt.excerpt == "ok"


async def test_webhook_jobs_are_signed_with_every_secret_in_force() -> None:
    old, new = generate_secret(), generate_secret()
    message = job(endpoint_id=3, idempotency_key="evt-1:3", secrets=(new, old))
    (request,), _ = await send(DispatcherConfig(), message, httpx.Response(200))
    headers = dict(request.headers)
    assert headers["webhook-id"] == "evt-1:3"
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # a receiver holding either one accepts it
        Webhook(secret).verify(request.content, headers)


async def test_response_excerpt_is_bounded_even_when_already_read() -> None:
    config = DispatcherConfig(max_response_bytes=100, excerpt_bytes=10)
    _, attempt = await send(config, job(), httpx.Response(500, content=b"y" * 5000))
    assert attempt.outcome.verdict is Verdict.RETRY
    assert attempt.excerpt == "y" * 10


async def test_an_endpoints_own_headers_replace_a_messages_of_the_same_name() -> None:
    message = job(
        endpoint_id=3,
        secrets=(generate_secret(),),
        headers={"x-tenant": "from-message", "X-Other": "kept"},
        auth_headers={"X-Tenant": "acme", "User-Agent": "partner-agent", "Authorization": "B t"},
    )
    (request,), _ = await send(DispatcherConfig(), message, httpx.Response(200))
    assert request.headers.get_list("x-tenant") == ["acme"]
    assert request.headers["x-other"] == "kept"
    assert request.headers.get_list("user-agent") == ["partner-agent"]  # no default beside it
    assert request.headers["authorization"] == "B t"
    assert request.headers["idempotency-key"] == '"order-\\"7\\""'
