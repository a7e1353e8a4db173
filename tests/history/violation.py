"""A broken rule, with what shows it."""

from __future__ import annotations

from dataclasses import dataclass

CAP_CHANGE_DEFECT = (
    "the known defect of a cap changed while requests are in flight: a request left "
    "without a slot is not counted, so one more may start "
    "(tests/unit/test_protocol_model.py::test_no_claim_starts_while_the_cap_is_full)"
)
"""Why a cap violation is expected, for now, when a request in flight across a cap
change is still running at the claim that exceeded the cap."""


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
            lines.append(f"    (expected: {self.known})")
        lines.extend(f"    {line}" for line in self.evidence)
        return "\n".join(lines)
