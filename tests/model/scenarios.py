"""The bounds the model is checked within, one configuration per concern.

Each is small enough to search whole in a second or so, and large enough for
the rules it is about to be broken in it when the protocol loses one of its own
(``tests/unit/test_protocol_model.py`` seeds each such bug and sees it found).
Leases are one tick long, which lets a lease run out, be renewed, or be rescued
in any order with everything else.
"""

from __future__ import annotations

from dataclasses import replace

from tests.model.state import Config

LEASES = Config(
    producers=((None,), (None,)),
    committed=True,
    dispatchers=2,
    crashes=1,
    max_attempts=2,
    lease=1,
    flights=2,
)
"""Two messages, two dispatchers holding up to two each, one of which may crash:
leases that run out, are renewed late, rescued and taken over (by the other
dispatcher or by the same one), and writes by owners whose lease was taken."""

SHUTDOWN = Config(
    producers=((None,), (None,)),
    committed=True,
    dispatchers=2,
    crashes=0,
    stops=1,
    max_attempts=2,
    lease=1,
    flights=1,
)
"""As LEASES (one message held at a time), but a dispatcher is stopped instead of
crashing: what it holds is answered and written, or released, sent or unsent."""

ORDERING = Config(
    producers=(("K",), ("K",)),
    dispatchers=2,
    crashes=1,
    max_attempts=2,
    lease=1,
    flights=1,
)
"""Two producers write a message of one ordering key each, in transactions that
interleave with each other and with the dispatchers' claims, retries, crashes
and rescues."""

REDRIVE = Config(
    producers=(("K",), ("K",), ("K",)),
    committed=True,
    dispatchers=2,
    crashes=1,
    max_attempts=2,
    lease=1,
    flights=1,
    operator_retries=1,
)
"""Three committed messages of one key, and an operator who may redrive a dead
one (``outbox dead retry``) while a later one runs or after it was delivered."""

CAP = Config(
    producers=((None,), (None,), (None,)),
    committed=True,
    dispatchers=1,
    crashes=0,
    max_attempts=1,
    lease=1,
    flights=3,
    cap=2,
    cap_plan=(1, 2),
)
"""Three messages to a destination whose cap of 2 an operator lowers to 1 and
raises back to 2, at any moment, requests in flight or not. One dispatcher
holding up to three at once interleaves them as three would (the cap counts
rows, whoever holds them), its leases running out and rescued as any."""

CAP_SET = replace(CAP, cap=None, cap_plan=(1,))
"""As CAP, but the destination has no cap until an operator sets one of 1, at
any moment, requests in flight or not."""

BREAKER = Config(
    producers=((None,), (None,)),
    committed=True,
    dispatchers=2,
    crashes=1,
    max_attempts=2,
    lease=1,
    flights=1,
    breaker=True,
)
"""Two messages to a destination whose breaker any failure opens: probes taken,
answered, lost with a crashed dispatcher and taken again."""

ALL = {
    "leases": LEASES,
    "shutdown": SHUTDOWN,
    "ordering": ORDERING,
    "redrive": REDRIVE,
    "cap": CAP,
    "cap set": CAP_SET,
    "breaker": BREAKER,
}

KEYS = Config(
    producers=(("K", "K"), ("K",)),
    dispatchers=2,
    crashes=1,
    max_attempts=2,
    lease=1,
    flights=2,
)
"""One producer writes two messages of a key, another one, in transactions that
interleave: the second may start its write while the first holds the key."""

BOTH_ORDERS = Config(
    producers=(("K", "L"), ("L", "K")),
    dispatchers=2,
    crashes=1,
    max_attempts=2,
    lease=1,
    flights=2,
)
"""Two producers take two keys in opposite orders: one waits on the other, or
rolls back as a deadlock victim would."""

CONFORMANCE = {
    "leases": LEASES,
    "shutdown": SHUTDOWN,
    "keys": KEYS,
    "both orders": BOTH_ORDERS,
    "redrive": replace(REDRIVE, max_attempts=1),
    "cap": CAP,
    "cap set": CAP_SET,
}
"""The scenarios the real statements are walked through (tests.model.conformance):
no breaker, whose transitions the dispatcher's Python decides, not a statement.
The redrive's messages die at their first failure, so that more of each walk is
spent after an operator's retry."""
