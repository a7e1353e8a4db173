"""The defaults the documentation promises are the ones the code has.

Each default is read from its one definition in the code and from the one
sentence about it in the README and the site's pages, and both must equal the
documented value: a change to either side alone fails here.
"""

from __future__ import annotations

import re

from dispatchers.delivery.retry import STANDARD_WEBHOOKS_SCHEDULE
from dispatchers.runtime.config import DispatcherConfig
from outbox import Outbox
from outbox._filters import COMPILED_CACHE, MAX_FAN_OUT, MAX_FILTER_LENGTH
from outbox._policy_fields import DEFAULT_MAX_BURST, MAX_BURST, default_burst
from outbox.defaults import DEFAULT_WEBHOOK_MAX_ATTEMPTS
from tests.docs import all_docs_text, prose

DOCS = prose(all_docs_text())
DAY = 24 * 3600
UNIT_SECONDS = {"s": 1, "min": 60, "h": 3600}


def readme(pattern: str) -> re.Match[str]:
    """The one match of ``pattern`` in the README and the pages, all together
    (whitespace in it matches line breaks)."""
    matches = list(re.finditer(pattern, DOCS))
    assert len(matches) == 1, f"{pattern!r} matches the docs {len(matches)} times"
    return matches[0]


def test_an_endpoint_failing_for_5_days_is_disabled() -> None:
    days = int(readme(r"every attempt has failed for (\d+) days is disabled").group(1))
    assert days == 5
    assert DispatcherConfig().disable_after == days * DAY


def test_delivered_history_is_kept_7_days() -> None:
    days = int(readme(r"\| `--retention SPAN` \| `(\d+)d` \|").group(1))
    assert days == 7
    assert DispatcherConfig().retention == days * DAY


def test_a_webhook_gets_8_attempts_on_the_standard_webhooks_schedule() -> None:
    listed = readme(r"Retries follow the Standard Webhooks schedule: ([^(]*) \(about a day\)")
    delays = [
        int(number) * UNIT_SECONDS[unit]
        for number, unit in (item.split() for item in listed.group(1).split(", "))
    ]
    assert delays == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert list(STANDARD_WEBHOOKS_SCHEDULE.delays) == delays
    # the first attempt, then one per delay: the message is dead after the last
    assert DEFAULT_WEBHOOK_MAX_ATTEMPTS == 1 + len(STANDARD_WEBHOOKS_SCHEDULE.delays) == 8
    assert Outbox().webhook_max_attempts == DEFAULT_WEBHOOK_MAX_ATTEMPTS


def test_a_destination_may_hold_all_but_a_quarter_of_the_request_slots() -> None:
    bound, slots = readme(r"requests in flight \((\d+) of the default (\d+)\)").groups()
    assert (int(bound), int(slots)) == (48, 64)
    config = DispatcherConfig()
    assert (config.per_destination, config.concurrency) == (48, 64)


def test_a_rate_limits_default_burst_is_a_seconds_worth_from_1_to_10() -> None:
    shown = readme(
        r"the rate rounded up, from 1 to (\d+) \((\d+)/s bursts (\d+), ([\d.]+)/s bursts (\d+), "
        r"([\d.]+)/s bursts (\d+)\), at most (\d+)\."
    ).groups()
    most, *examples, largest = shown
    assert int(most) == DEFAULT_MAX_BURST == 10
    assert int(largest) == MAX_BURST == 100
    for rate, burst in zip(examples[::2], examples[1::2], strict=True):
        assert default_burst(float(rate)) == int(burst)


def test_a_filter_is_bounded_to_256_characters_and_a_fan_out_of_4() -> None:
    length, fan_out = readme(
        r"A filter has at most (\d+) characters, and its multi-selects .* may multiply "
        r"what later steps walk by at most (\d+)\."
    ).groups()
    assert (int(length), int(fan_out)) == (256, 4)
    assert (MAX_FILTER_LENGTH, MAX_FAN_OUT) == (256, 4)
    cached = readme(r"compiled once per process \(the ([\d,]+) most recent texts are kept\)")
    assert int(cached.group(1).replace(",", "")) == COMPILED_CACHE == 1024


def test_the_circuit_breaker_defaults() -> None:
    match = readme(
        r"When at least `--breaker-min-attempts` \((\d+)\) of a dispatcher's attempts to a "
        r"destination in the last `--breaker-window` \((\d+) s\) were made and at least "
        r"`--breaker-failure-ratio` \(([\d.]+)\) of them failed"
    )
    assert match.groups() == ("10", "30", "0.5")
    backoff = readme(r"After `--breaker-backoff` \((\d+) s\)").group(1)
    most = readme(r"up to `--breaker-backoff-max` \((\d+) s\)").group(1)
    config = DispatcherConfig()
    assert (
        config.breaker_min_attempts,
        config.breaker_window,
        config.breaker_failure_ratio,
        config.breaker_backoff,
        config.breaker_backoff_max,
    ) == (10, 30, 0.5, float(backoff), float(most))
