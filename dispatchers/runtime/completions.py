"""What a claim ends with: the :class:`~dispatchers.store.messages.Completion` the flusher writes.

Pure functions from a claimed message and what became of it (an attempt, a retry
policy that failed, a release) to the row update and attempt row that record it.
The fence (owner and attempt number) is the claim's; the completion statement
applies it.
"""

from __future__ import annotations

from datetime import datetime

from dispatchers.delivery.http import Attempt
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.outcome import Verdict, decide
from dispatchers.delivery.retry import policy_for
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.store.messages import Completion

__all__ = [
    "POLICY_FAILED_DELAY",
    "WITHHELD_DELAY",
    "blocked",
    "from_attempt",
    "policy_failed",
    "released",
    "withheld",
]

POLICY_FAILED_DELAY = 60.0
"""Seconds until the next attempt when the retry policy raised: soon, rather than
never (the message is not stuck) or at once (the policy may fail again)."""

WITHHELD_DELAY = 60.0
"""Seconds a webhook whose secrets could not be opened waits before it is claimed
again: time for an operator to give the dispatchers the key, without a claim of
it in every loop meanwhile."""


def from_attempt(job: Job, attempt: Attempt, config: DispatcherConfig) -> Completion:
    """Record ``attempt``: delivered, retried after the policy's delay, or dead.

    A message follows the retry schedule its claim found (its endpoint's, else its
    event type's); without one, webhook deliveries (those with an endpoint) follow
    ``webhook_retry_policy``, other messages ``retry_policy``. Raises what the
    policy raises. A destination the SSRF guard refused holds the message
    (:func:`blocked`) instead: nothing was sent.
    """
    outcome = attempt.outcome
    if outcome.verdict is Verdict.BLOCKED:
        return blocked(job, attempt, delay=config.blocked_delay)
    webhook = job.endpoint_id is not None
    default = config.webhook_retry_policy if webhook else config.retry_policy
    decision = decide(
        outcome,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        policy=policy_for(job.retry_schedule, default),
        retry_base=job.retry_base,
    )
    return Completion(
        id=job.id,
        attempt=job.attempts,
        state=decision.state,
        outcome=str(outcome.verdict),
        sent=True,
        delay=decision.delay,
        status=outcome.status,
        error_class=outcome.error_class,
        error=outcome.error,
        started_at=attempt.started_at,
        duration_ms=attempt.duration_ms,
        excerpt=attempt.excerpt,
        endpoint_id=job.endpoint_id,
        trace_id=attempt.trace_id,
    )


def policy_failed(job: Job, attempt: Attempt, exc: BaseException) -> Completion:
    """Record ``attempt`` when the retry policy raised ``exc``: try again after
    :data:`POLICY_FAILED_DELAY`, or dead when the attempts are spent."""
    return Completion(
        id=job.id,
        attempt=job.attempts,
        state="ready" if job.attempts < job.max_attempts else "dead",
        outcome=str(attempt.outcome.verdict),
        sent=True,
        delay=POLICY_FAILED_DELAY,
        status=attempt.outcome.status,
        error_class="internal_error",
        error=f"retry policy failed: {type(exc).__name__}",
        started_at=attempt.started_at,
        duration_ms=attempt.duration_ms,
        trace_id=attempt.trace_id,
    )


def released(
    job: Job, *, started_at: datetime | None = None, duration_ms: int | None = None
) -> Completion:
    """Give the message back, ready at once.

    Never started (no ``started_at``): the attempt is refunded and no attempt row
    is written. Cut short at shutdown: the attempt counts, since the request may
    have reached the receiver, and its row records when it started.
    """
    if started_at is None:
        return Completion(
            id=job.id, attempt=job.attempts, state="ready", outcome="released", sent=False
        )
    return Completion(
        id=job.id,
        attempt=job.attempts,
        state="ready",
        outcome="released",
        sent=True,
        error_class="shutdown",
        error="released at shutdown before the response arrived",
        started_at=started_at,
        duration_ms=duration_ms,
    )


def withheld(job: Job) -> Completion:
    """Hold back a webhook whose signing secrets could not be opened
    (``job.secrets_unavailable``): never sent unsigned, it is given back unsent,
    its attempt refunded, and due again after :data:`WITHHELD_DELAY`; its last
    error says why."""
    return Completion(
        id=job.id,
        attempt=job.attempts,
        state="ready",
        outcome="released",
        sent=False,
        delay=WITHHELD_DELAY,
        error_class="secrets_unavailable",
        error=f"held unsent: {job.secrets_unavailable}",
    )


def blocked(job: Job, attempt: Attempt, *, delay: float) -> Completion:
    """Hold a message whose destination the SSRF guard refused: a setting of the
    dispatcher (``--allow-private-networks``, ``--allow-network``), not a fault of
    the message. Nothing was sent, so it is given back unsent, its attempt
    refunded and no attempt row written, due again after ``delay``; its last
    error names the address and the options that allow it. A dispatcher started
    with them delivers it; one without never spends it."""
    return Completion(
        id=job.id,
        attempt=job.attempts,
        state="ready",
        outcome=str(Verdict.BLOCKED),
        sent=False,
        delay=delay,
        error_class=attempt.outcome.error_class,
        error=f"held unsent: {attempt.outcome.error}",
    )
