"""Classification of HTTP attempts and the next-state decision."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from datetime import UTC, datetime

import httpx
import pytest

from dispatchers.delivery.outcome import (
    ABORT_HEADER,
    DEFAULT_RETRY_STATUSES,
    Decision,
    Outcome,
    Verdict,
    classify_exception,
    classify_response,
    decide,
)
from dispatchers.delivery.retry import (
    MAX_DELAY,
    STANDARD_WEBHOOKS_SCHEDULE,
    ExponentialBackoff,
    Schedule,
)
from dispatchers.delivery.ssrf import BlockedDestination

NOW = datetime(2015, 10, 21, 7, 26, 0, tzinfo=UTC)
BLOCKED_TEXT = "hooks.example.com resolved to 10.0.0.7 (private)"


# --- classify_response ----------------------------------------------------------------


def test_verdict_values_are_stable_strings() -> None:
    # "blocked" added: a refused destination is held, not failed
    assert [str(v) for v in Verdict] == ["delivered", "retry", "failed", "gone", "blocked"]


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_succeeds(status: int) -> None:
    assert classify_response(status, {}, now=NOW) == Outcome(
        Verdict.DELIVERED, status, None, None, None
    )


def test_2xx_ignores_retry_after() -> None:
    outcome = classify_response(200, {"Retry-After": "120"}, now=NOW)
    assert outcome.retry_after is None


@pytest.mark.parametrize("status", [503, 429, 410, 404, 302])
@pytest.mark.parametrize("value", ["true", "TRUE", " True "])
def test_the_abort_header_fails_the_message_whatever_the_status(status: int, value: str) -> None:
    headers = {ABORT_HEADER: value, "Retry-After": "5"}
    outcome = classify_response(status, headers, now=NOW)
    assert (outcome.verdict, outcome.status, outcome.error_class) == (
        Verdict.FAILED,
        status,
        "aborted",
    )
    assert outcome.error is not None
    assert outcome.error.startswith("the receiver stopped retries (HTTP ")
    assert outcome.error.endswith(" with Outbox-Abort: true)")
    decision = decide(outcome, attempts=1, max_attempts=8, policy=STANDARD_WEBHOOKS_SCHEDULE)
    assert decision == Decision("dead", 0.0, disable_endpoint=False)


def test_the_abort_header_is_found_in_any_case_and_ignored_unless_true() -> None:
    assert classify_response(503, {"Outbox-Abort": "true"}, now=NOW).error_class == "aborted"
    for value in ("false", "1", "yes", ""):
        assert classify_response(503, {"Outbox-Abort": value}, now=NOW).verdict is Verdict.RETRY
    assert classify_response(200, {"Outbox-Abort": "true"}, now=NOW).verdict is Verdict.DELIVERED


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (500, "HTTP 500 Internal Server Error"),
        (502, "HTTP 502 Bad Gateway"),
        (503, "HTTP 503 Service Unavailable"),
        (504, "HTTP 504 Gateway Timeout"),
        (599, "HTTP 599"),
    ],
)
def test_5xx_retries(status: int, error: str) -> None:
    assert classify_response(status, {}, now=NOW) == Outcome(
        Verdict.RETRY, status, error, f"http_{status}", None
    )


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (408, "HTTP 408 Request Timeout"),
        (425, "HTTP 425 Too Early"),
        (429, "HTTP 429 Too Many Requests"),
    ],
)
def test_408_425_429_retry(status: int, error: str) -> None:
    assert classify_response(status, {}, now=NOW) == Outcome(
        Verdict.RETRY, status, error, f"http_{status}", None
    )


def test_default_retry_statuses() -> None:
    assert frozenset({408, 425, 429}) == DEFAULT_RETRY_STATUSES


def test_429_carries_retry_after_seconds() -> None:
    outcome = classify_response(429, {"Retry-After": "120"}, now=NOW)
    assert outcome.retry_after == 120.0


def test_503_carries_retry_after_http_date() -> None:
    headers = httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:31:00 GMT"})
    assert classify_response(503, headers, now=NOW).retry_after == 300.0


def test_retry_after_lookup_is_case_insensitive_for_plain_dicts() -> None:
    outcome = classify_response(503, {"RETRY-AFTER": "45"}, now=NOW)
    assert outcome.retry_after == 45.0


@pytest.mark.parametrize("value", ["soon", "-1", "", "99999999999"])
def test_garbage_retry_after_is_ignored(value: str) -> None:
    outcome = classify_response(503, {"Retry-After": value}, now=NOW)
    assert outcome.verdict is Verdict.RETRY
    assert outcome.retry_after is None


def test_410_is_gone() -> None:
    assert classify_response(410, {}, now=NOW) == Outcome(
        Verdict.GONE, 410, "HTTP 410 Gone", "http_410", None
    )


@pytest.mark.parametrize("status", [300, 301, 302, 303, 304, 307, 308])
def test_3xx_fails_without_following(status: int) -> None:
    headers = {"Location": "http://169.254.169.254/latest/meta-data"}
    assert classify_response(status, headers, now=NOW) == Outcome(
        Verdict.FAILED, status, f"redirect not followed (HTTP {status})", "redirect", None
    )


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, "HTTP 400 Bad Request"),
        (401, "HTTP 401 Unauthorized"),
        (403, "HTTP 403 Forbidden"),
        (404, "HTTP 404 Not Found"),
        (409, "HTTP 409 Conflict"),
        (422, "HTTP 422 Unprocessable Entity"),
        (451, "HTTP 451 Unavailable For Legal Reasons"),
        (499, "HTTP 499"),
    ],
)
def test_other_4xx_fails_permanently(status: int, error: str) -> None:
    assert classify_response(status, {"Retry-After": "5"}, now=NOW) == Outcome(
        Verdict.FAILED, status, error, f"http_{status}", None
    )


@pytest.mark.parametrize(
    ("status", "error"), [(100, "HTTP 100 Continue"), (101, "HTTP 101 Switching Protocols")]
)
def test_1xx_fails(status: int, error: str) -> None:
    assert classify_response(status, {}, now=NOW) == Outcome(
        Verdict.FAILED, status, error, f"http_{status}", None
    )


@pytest.mark.parametrize("status", [-1, 0, 99, 600, 999])
def test_status_outside_100_599_fails(status: int) -> None:
    assert classify_response(status, {}, now=NOW) == Outcome(
        Verdict.FAILED, status, f"invalid HTTP status {status}", "invalid_status", None
    )


def test_retry_statuses_make_extra_4xx_retryable() -> None:
    statuses = DEFAULT_RETRY_STATUSES | {409}
    outcome = classify_response(409, {"Retry-After": "30"}, now=NOW, retry_statuses=statuses)
    assert outcome == Outcome(Verdict.RETRY, 409, "HTTP 409 Conflict", "http_409", 30.0)
    assert classify_response(429, {}, now=NOW, retry_statuses=statuses).verdict is Verdict.RETRY


def test_retry_statuses_replace_the_default_4xx_set() -> None:
    outcome = classify_response(429, {}, now=NOW, retry_statuses=frozenset({409}))
    assert outcome.verdict is Verdict.FAILED


def test_5xx_retries_even_with_empty_retry_statuses() -> None:
    outcome = classify_response(500, {}, now=NOW, retry_statuses=frozenset())
    assert outcome.verdict is Verdict.RETRY


def test_410_listed_in_retry_statuses_retries_instead_of_disabling() -> None:
    outcome = classify_response(410, {}, now=NOW, retry_statuses=frozenset({410}))
    assert outcome.verdict is Verdict.RETRY


# --- classify_exception ---------------------------------------------------------------


def test_blocked_destination_is_blocked_with_its_text() -> None:
    # a setting of the dispatcher, not a fault of the message: held, never dead
    assert classify_exception(BlockedDestination(BLOCKED_TEXT)) == Outcome(
        Verdict.BLOCKED, None, BLOCKED_TEXT, "blocked_destination", None
    )


@pytest.mark.parametrize("attempts", [1, 5])
def test_a_blocked_destination_is_ready_again_at_any_attempt(attempts: int) -> None:
    outcome = classify_exception(BlockedDestination(BLOCKED_TEXT))
    decision = decide(outcome, attempts=attempts, max_attempts=5, policy=ExponentialBackoff())
    assert decision == Decision("ready", 0.0, disable_endpoint=False)


def _raise_chained(outer: Exception, inner: BaseException, *, explicit: bool) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            if explicit:
                raise outer from exc
            raise outer  # noqa: B904 - implicit __context__ is the point
    except Exception as caught:
        return caught
    raise AssertionError("unreachable")


@pytest.mark.parametrize("explicit", [True, False], ids=["cause", "context"])
def test_blocked_destination_found_inside_wrapping_exception(explicit: bool) -> None:
    exc = _raise_chained(
        httpx.ConnectError("All connection attempts failed"),
        BlockedDestination(BLOCKED_TEXT),
        explicit=explicit,
    )
    assert classify_exception(exc) == Outcome(
        Verdict.BLOCKED, None, BLOCKED_TEXT, "blocked_destination", None
    )


def test_blocked_destination_found_several_levels_down() -> None:
    exc: BaseException = BlockedDestination(BLOCKED_TEXT)
    for _ in range(5):
        wrapper = RuntimeError("wrapped")
        wrapper.__cause__ = exc
        exc = wrapper
    assert classify_exception(exc).error_class == "blocked_destination"


def test_blocked_destination_found_inside_exception_group() -> None:
    group = ExceptionGroup("connect", [OSError("refused"), BlockedDestination(BLOCKED_TEXT)])
    assert classify_exception(group).error_class == "blocked_destination"


def test_chain_walk_is_bounded() -> None:
    exc: BaseException = BlockedDestination(BLOCKED_TEXT)
    for _ in range(100):
        wrapper = httpx.ConnectError("wrapped")
        wrapper.__cause__ = exc
        exc = wrapper
    assert classify_exception(exc).error_class == "connect_error"


def test_chain_walk_survives_cycles() -> None:
    first = httpx.ReadError("first")
    second = ValueError("second")
    first.__cause__ = second
    second.__context__ = first
    assert classify_exception(first) == Outcome(
        Verdict.RETRY, None, "network error: first", "network_error", None
    )


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (httpx.ConnectTimeout("timed out"), "connect timeout: timed out"),
        (httpx.ReadTimeout("timed out"), "read timeout: timed out"),
        (httpx.WriteTimeout("timed out"), "write timeout: timed out"),
        (httpx.PoolTimeout("timed out"), "pool timeout: timed out"),
        (httpx.TimeoutException("timed out"), "timeout: timed out"),
        (httpx.ReadTimeout(""), "read timeout"),
    ],
)
def test_timeouts_retry_naming_which_timeout(exc: Exception, error: str) -> None:
    assert classify_exception(exc) == Outcome(Verdict.RETRY, None, error, "timeout", None)


def test_connect_error_retries() -> None:
    exc = httpx.ConnectError("[Errno 111] Connection refused")
    assert classify_exception(exc) == Outcome(
        Verdict.RETRY, None, "connect error: [Errno 111] Connection refused", "connect_error", None
    )


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            "protocol error: Server disconnected without sending a response.",
        ),
        (httpx.LocalProtocolError("Illegal header value"), "protocol error: Illegal header value"),
        (httpx.ProtocolError("bad framing"), "protocol error: bad framing"),
    ],
)
def test_protocol_errors_retry(exc: Exception, error: str) -> None:
    assert classify_exception(exc) == Outcome(Verdict.RETRY, None, error, "protocol_error", None)


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (httpx.ReadError("connection reset"), "network error: connection reset"),
        (httpx.WriteError("broken pipe"), "network error: broken pipe"),
        (httpx.CloseError("close failed"), "network error: close failed"),
        (httpx.NetworkError("unreachable"), "network error: unreachable"),
        (httpx.ProxyError("proxy said no"), "network error: proxy said no"),
        (httpx.TransportError("transport"), "network error: transport"),
    ],
)
def test_other_transport_errors_retry_as_network_error(exc: Exception, error: str) -> None:
    assert classify_exception(exc) == Outcome(Verdict.RETRY, None, error, "network_error", None)


def test_invalid_url_fails() -> None:
    exc = httpx.InvalidURL("Invalid non-printable ASCII character in URL")
    assert classify_exception(exc) == Outcome(
        Verdict.FAILED,
        None,
        "invalid URL: Invalid non-printable ASCII character in URL",
        "invalid_url",
        None,
    )


def test_unsupported_protocol_fails() -> None:
    exc = httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'ftp://'.")
    assert classify_exception(exc) == Outcome(
        Verdict.FAILED,
        None,
        "unsupported protocol: Request URL has an unsupported protocol 'ftp://'.",
        "unsupported_protocol",
        None,
    )


def test_too_many_redirects_fails_as_redirect() -> None:
    exc = httpx.TooManyRedirects("Exceeded maximum allowed redirects.")
    assert classify_exception(exc) == Outcome(
        Verdict.FAILED,
        None,
        "redirect not followed: Exceeded maximum allowed redirects.",
        "redirect",
        None,
    )


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (ValueError('payload {"card": "4111111111111111"}'), "internal error: ValueError"),
        (KeyError("secret"), "internal error: KeyError"),
        (httpx.DecodingError("bad gzip"), "internal error: DecodingError"),
    ],
)
def test_unexpected_exception_retries_with_type_name_only(exc: Exception, error: str) -> None:
    assert classify_exception(exc) == Outcome(Verdict.RETRY, None, error, "internal_error", None)


def test_cancellation_if_classified_retries_as_interrupted() -> None:
    assert classify_exception(asyncio.CancelledError("lease lost")) == Outcome(
        Verdict.RETRY, None, "interrupted: CancelledError", "interrupted", None
    )


def test_error_text_is_bounded_to_500_chars() -> None:
    outcome = classify_exception(httpx.ConnectError("x" * 2000))
    assert outcome.error == "connect error: " + "x" * 482 + "..."
    assert len(outcome.error) == 500


def test_blocked_destination_text_is_bounded_to_500_chars() -> None:
    outcome = classify_exception(BlockedDestination("h" * 600))
    assert outcome.error == "h" * 497 + "..."


def test_error_text_collapses_newlines() -> None:
    outcome = classify_exception(httpx.ReadError("line one\n  line two\r\n"))
    assert outcome.error == "network error: line one line two"


def test_outcome_is_immutable() -> None:
    outcome = classify_response(200, {}, now=NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.verdict = Verdict.FAILED  # type: ignore[misc]


# --- decide ---------------------------------------------------------------------------


class RecordingPolicy:
    """A RetryPolicy that returns a fixed delay and records its calls."""

    def __init__(self, result: float = 42.0) -> None:
        self.result = result
        self.calls: list[tuple[int, float | None]] = []

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        self.calls.append((attempt, retry_after))
        return self.result


def _outcome(verdict: Verdict, retry_after: float | None = None) -> Outcome:
    return Outcome(verdict, None, None, None, retry_after)


def test_decide_delivered() -> None:
    policy = RecordingPolicy()
    decision = decide(_outcome(Verdict.DELIVERED), attempts=1, max_attempts=5, policy=policy)
    assert decision == Decision("delivered", 0.0, disable_endpoint=False)
    assert policy.calls == []


def test_decide_failed_is_dead_even_with_attempts_left() -> None:
    policy = RecordingPolicy()
    decision = decide(_outcome(Verdict.FAILED), attempts=1, max_attempts=5, policy=policy)
    assert decision == Decision("dead", 0.0, disable_endpoint=False)
    assert policy.calls == []


@pytest.mark.parametrize("attempts", [1, 5, 9])
def test_decide_gone_is_dead_and_disables_endpoint(attempts: int) -> None:
    policy = RecordingPolicy()
    decision = decide(_outcome(Verdict.GONE), attempts=attempts, max_attempts=5, policy=policy)
    assert decision == Decision("dead", 0.0, disable_endpoint=True)
    assert policy.calls == []


def test_decide_retry_with_attempts_left_is_ready_after_policy_delay() -> None:
    policy = RecordingPolicy(42.0)
    decision = decide(_outcome(Verdict.RETRY), attempts=1, max_attempts=5, policy=policy)
    assert decision == Decision("ready", 42.0, disable_endpoint=False)
    assert policy.calls == [(1, None)]


def test_decide_passes_retry_after_to_policy() -> None:
    policy = RecordingPolicy()
    decide(_outcome(Verdict.RETRY, retry_after=120.0), attempts=3, max_attempts=5, policy=policy)
    assert policy.calls == [(3, 120.0)]


def test_decide_last_allowed_retry_is_still_ready() -> None:
    decision = decide(_outcome(Verdict.RETRY), attempts=4, max_attempts=5, policy=RecordingPolicy())
    assert decision.state == "ready"


@pytest.mark.parametrize("attempts", [5, 6])
def test_decide_retry_with_attempts_exhausted_is_dead(attempts: int) -> None:
    policy = RecordingPolicy()
    decision = decide(_outcome(Verdict.RETRY), attempts=attempts, max_attempts=5, policy=policy)
    assert decision == Decision("dead", 0.0, disable_endpoint=False)
    assert policy.calls == []


def test_decide_single_attempt_budget_never_retries() -> None:
    decision = decide(_outcome(Verdict.RETRY), attempts=1, max_attempts=1, policy=RecordingPolicy())
    assert decision.state == "dead"


def test_decide_clamps_negative_policy_delay_to_zero() -> None:
    decision = decide(
        _outcome(Verdict.RETRY), attempts=1, max_attempts=5, policy=RecordingPolicy(-3.0)
    )
    assert decision == Decision("ready", 0.0, disable_endpoint=False)


@pytest.mark.parametrize(
    ("answer", "delay"), [(math.inf, MAX_DELAY), (1e308, MAX_DELAY), (math.nan, 0.0)]
)
def test_decide_holds_any_policy_delay_within_the_maximum(answer: float, delay: float) -> None:
    """``now() + delay`` is written to the row: a policy's answer must never make
    that overflow a timestamp (the outcome write would fail)."""
    decision = decide(
        _outcome(Verdict.RETRY), attempts=1, max_attempts=5, policy=RecordingPolicy(answer)
    )
    assert decision == Decision("ready", delay, disable_endpoint=False)


def test_decide_with_exponential_backoff() -> None:
    policy = ExponentialBackoff(random=lambda: 0.5)
    decision = decide(_outcome(Verdict.RETRY), attempts=3, max_attempts=10, policy=policy)
    assert decision == Decision("ready", 8.0, disable_endpoint=False)


def test_decide_with_standard_schedule_and_retry_after_from_response() -> None:
    policy = dataclasses.replace(STANDARD_WEBHOOKS_SCHEDULE, random=lambda: 0.5)
    outcome = classify_response(429, {"Retry-After": "900"}, now=NOW)
    assert decide(outcome, attempts=2, max_attempts=8, policy=policy) == Decision(
        "ready", 900.0, disable_endpoint=False
    )
    assert decide(outcome, attempts=3, max_attempts=8, policy=policy) == Decision(
        "ready", 1800.0, disable_endpoint=False
    )


def test_redriven_message_restarts_its_schedule_from_the_budget_base() -> None:
    schedule = Schedule(delays=(5.0, 300.0, 1800.0), jitter=0.0)
    retry = Outcome(Verdict.RETRY, 503, "HTTP 503", "http_503", None)
    # attempt 9 overall, the first of a budget that began after attempt 8
    redriven = decide(retry, attempts=9, max_attempts=16, policy=schedule, retry_base=8)
    assert (redriven.state, redriven.delay) == ("ready", 5.0)
    # without the base, the same attempt would wait at the end of the schedule
    plain = decide(retry, attempts=9, max_attempts=16, policy=schedule)
    assert plain.delay == 1800.0


# --- boundaries and texts that mutation testing found unpinned -------------------------


def test_the_abort_error_names_the_status_it_came_with() -> None:
    outcome = classify_response(400, {ABORT_HEADER: "true"}, now=NOW)
    assert outcome.error == (
        "the receiver stopped retries (HTTP 400 Bad Request with Outbox-Abort: true)"
    )


def test_retry_after_is_measured_from_the_current_time_when_no_now_is_given() -> None:
    assert classify_response(503, {"Retry-After": "120"}).retry_after == 120.0


def test_every_3xx_up_to_399_is_a_redirect() -> None:
    assert classify_response(399, {}, now=NOW) == Outcome(
        Verdict.FAILED, 399, "redirect not followed (HTTP 399)", "redirect", None
    )


def _chain(depth: int) -> BaseException:
    """A ``BlockedDestination`` as the cause of ``depth`` wrapping errors."""
    exc: BaseException = BlockedDestination(BLOCKED_TEXT)
    for _ in range(depth):
        wrapper = httpx.ConnectError("wrapped")
        wrapper.__cause__ = exc
        exc = wrapper
    return exc


def test_the_chain_walk_inspects_sixteen_exceptions_and_no_more() -> None:
    assert classify_exception(_chain(15)).error_class == "blocked_destination"  # the 16th
    assert classify_exception(_chain(16)).error_class == "connect_error"  # the 17th


def test_an_exception_met_twice_does_not_end_the_walk() -> None:
    twice = OSError("refused")
    group = ExceptionGroup("connect", [twice, twice, BlockedDestination(BLOCKED_TEXT)])
    assert classify_exception(group).error_class == "blocked_destination"


def test_error_text_of_exactly_500_chars_is_kept_whole() -> None:
    outcome = classify_exception(BlockedDestination("h" * 500))
    assert outcome.error == "h" * 500
