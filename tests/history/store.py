"""A history written to JSON and read back, so that a run's checks can be run
again, and their evidence read, without running it again
(``python -m tests.history --recheck DIR/history.json``)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.history.history import (
    AttemptRow,
    Destination,
    Fault,
    FinalMessage,
    HealthEvent,
    History,
    LockWait,
    MessageEvent,
    Operation,
    PolicyChange,
    Process,
    Request,
    SlotEvent,
    Timing,
    Txn,
    Write,
)

_ROWS: dict[str, type[Any]] = {
    "destinations": Destination,
    "requests": Request,
    "message_events": MessageEvent,
    "health_events": HealthEvent,
    "slot_events": SlotEvent,
    "attempts": AttemptRow,
    "finals": FinalMessage,
    "processes": Process,
    "faults": Fault,
    "policies": PolicyChange,
    "operations": Operation,
    "lock_waits": LockWait,
}
_TUPLES = {"ids", "waiting"}
"""Fields of those rows that are tuples (JSON gives lists)."""


def dump(history: History, path: Path) -> None:
    path.write_text(json.dumps(dataclasses.asdict(history)), encoding="utf-8")


def load(path: Path) -> History:
    raw = json.loads(path.read_text(encoding="utf-8"))
    fields: dict[str, Any] = {
        "seed": raw["seed"],
        "timing": Timing(**raw["timing"]),
        "effects": Counter(raw["effects"]),
        "notes": tuple(raw["notes"]),
        "txns": tuple(
            Txn(
                **{
                    **t,
                    "writes": tuple(Write(**{**w, "ids": tuple(w["ids"])}) for w in t["writes"]),
                }
            )
            for t in raw["txns"]
        ),
    }
    for name, kind in _ROWS.items():
        fields[name] = tuple(kind(**_row(row)) for row in raw.get(name, ()))
    return History(**fields)


def _row(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: tuple(v) if k in _TUPLES else v for k, v in row.items()}
    if "lost" in out:  # a process's lease_lost events
        out["lost"] = tuple(tuple(x) for x in out["lost"])
    return out
