"""A broken rule, with what shows it."""

from __future__ import annotations

from dataclasses import dataclass

CAP_CHANGE_DEFECT = (
    "a cap changed while requests to the destination were in flight, and one of them "
    "still ran when a claim exceeded the cap: the case of the protocol model's cap "
    "scenarios (tests/unit/test_protocol_model.py)"
)
"""The context of a cap violation that a cap change under running requests led to:
what the protocol model's cap scenarios cover, and the known defect of such a
change (a request left without a slot must still be counted)."""


@dataclass(frozen=True)
class Violation:
    """One violation found by the check named ``check``: a sentence, the evidence
    (one line each: rows, requests, leases, with their times), and, when it is an
    instance of a known defect, which one (see :data:`CAP_CHANGE_DEFECT`)."""

    check: str
    message: str
    evidence: tuple[str, ...] = ()
    known: str | None = None

    def describe(self, seed: int | None = None) -> str:
        head = f"[{self.check}]" + (f" seed {seed}:" if seed is not None else "")
        lines = [f"{head} {self.message}"]
        if self.known:
            lines.append(f"    (known: {self.known})")
        lines.extend(f"    {line}" for line in self.evidence)
        return "\n".join(lines)
