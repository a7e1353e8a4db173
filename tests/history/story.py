"""Small hand-made histories for the checks' unit tests: a :class:`Story` writes
the audit rows, attempts, requests and final rows that a few messages' lives
leave, step by step, as the real system would."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from tests.history.history import (
    AttemptRow,
    Destination,
    FinalMessage,
    HealthEvent,
    History,
    MessageEvent,
    PolicyChange,
    Process,
    Request,
    Timing,
    Txn,
    Write,
)

T0 = 1_700_000_000.0
"""The stories' epoch: every time is T0 plus seconds."""
URL = "http://127.0.0.1:9000"


class Story:
    def __init__(self) -> None:
        self.seq = itertools.count(1)
        self.xids = itertools.count(100)
        self.events: list[MessageEvent] = []
        self.health: list[HealthEvent] = []
        self.attempts: list[AttemptRow] = []
        self.requests: list[Request] = []
        self.txns: list[Txn] = []
        self.finals: dict[int, FinalMessage] = {}
        self.rows: dict[int, dict[str, Any]] = {}
        self.policies: list[PolicyChange] = []
        self.processes: list[Process] = []
        self.effects: dict[str, int] = {}
        self.destinations = [Destination("a", "plain", URL, f"{URL}/a")]

    def _event(
        self,
        at: float,
        op: str,
        mid: int,
        app: str,
        xid: int | None = None,
        txn_start: float | None = None,
        **fields: Any,
    ) -> MessageEvent:
        e = MessageEvent(
            seq=next(self.seq),
            at=T0 + at,
            txn_start=T0 + (at if txn_start is None else txn_start),
            xid=next(self.xids) if xid is None else xid,
            app=app,
            op=op,
            id=mid,
            destination=self.rows.get(mid, {}).get("destination", URL),
            **fields,
        )
        self.events.append(e)
        return e

    def commit(
        self,
        at: float,
        *messages: tuple[int, str, str | None],
        producer: int = 1,
        committed: bool = True,
    ) -> int:
        """A producer transaction writing (id, key, ordering key) messages to
        destination "a", its COMMIT sent at ``at``; its xid."""
        xid = next(self.xids)
        writes = []
        for mid, key, ordering in messages:
            self.rows[mid] = {"destination": URL, "key": key, "ordering": ordering, "attempts": 0}
            if committed:
                self._event(
                    at - 0.01,
                    "insert",
                    mid,
                    f"producer-{producer}",
                    xid=xid,
                    new_state="ready",
                    ordering_key=ordering,
                    idempotency_key=key,
                    target=f"{URL}/a",
                    new_attempts=0,
                )
                self.finals[mid] = FinalMessage(mid, key, f"{URL}/a", URL, ordering, "ready", 0, 5)
            writes.append(Write("enqueue", "a", key, ordering, (mid,)))
        self.txns.append(
            Txn(
                producer,
                len(self.txns),
                xid,
                "commit" if committed else "rollback",
                committed,
                T0 + at - 0.05,
                T0 + at if committed else None,
                T0 + at + 0.001 if committed else None,
                tuple(writes),
            )
        )
        return xid

    def claim(
        self,
        at: float,
        mid: int,
        app: str = "d1",
        *,
        xid: int | None = None,
        lease: float = 2.0,
        txn_start: float | None = None,
    ) -> None:
        row = self.rows[mid]
        row["attempts"] += 1
        row["owner"], row["until"] = f"{app}-owner", T0 + at + lease
        self._event(
            at,
            "update",
            mid,
            app,
            xid=xid,
            txn_start=txn_start,
            old_state="ready",
            new_state="running",
            old_attempts=row["attempts"] - 1,
            new_attempts=row["attempts"],
            new_owner=row["owner"],
            new_lease_until=row["until"],
            ordering_key=row["ordering"],
        )

    def end(
        self,
        at: float,
        mid: int,
        how: str,
        app: str = "d1",
        *,
        status: int | None = 200,
        start: float | None = None,
    ) -> None:
        """End the running lease of ``mid``: delivered, ready (retry), dead, or
        rescued (the rescuer, ``app``, writes a lease_expired attempt row)."""
        row = self.rows[mid]
        common = {
            "old_state": "running",
            "old_attempts": row["attempts"],
            "old_owner": row["owner"],
            "old_lease_until": row["until"],
            "ordering_key": row["ordering"],
        }
        owner = row["owner"]
        if how == "delivered":
            self._event(at, "delete", mid, app, **common)
            outcome = "delivered"
        elif how == "rescued":
            self._event(
                at,
                "update",
                mid,
                app,
                new_state="ready",
                new_attempts=row["attempts"],
                last_error="lease expired: the dispatcher stopped renewing it",
                **common,
            )
            outcome, status = "lease_expired", None
        else:
            self._event(
                at,
                "update",
                mid,
                app,
                new_state=how,
                new_attempts=row["attempts"],
                last_error="HTTP 500",
                **common,
            )
            outcome = "retry" if how == "ready" else "failed"
        self.attempts.append(
            AttemptRow(
                mid,
                row["attempts"],
                owner,
                T0 + (start if start is not None else at - 0.1),
                100,
                status,
                outcome,
            )
        )
        state = {"delivered": "delivered", "dead": "dead"}.get(how, "ready")
        self.finals[mid] = dataclasses.replace(
            self.finals[mid],
            state=state,
            attempts=row["attempts"],
            last_error=None if state == "delivered" else "HTTP 500",
        )

    def request(
        self,
        mid: int,
        arrival: float,
        end: float,
        status: int | None = 200,
        destination: str = "a",
        **fields: Any,
    ) -> None:
        self.requests.append(
            Request(
                destination,
                self.rows[mid]["key"],
                T0 + arrival,
                T0 + end,
                "answered" if status else "client_closed",
                status,
                "ok",
                **fields,
            )
        )

    def reopen(self, at: float, mid: int, kind: str, *, xid: int = 900) -> None:
        """An operator's ``replay`` (a delivered message inserted again) or
        ``dead_retry`` (dead to ready) of ``mid`` in transaction ``xid``, its
        attempts kept."""
        row = self.rows[mid]
        if kind == "replay":
            self._event(
                at,
                "insert",
                mid,
                "history-operator",
                xid=xid,
                new_state="ready",
                new_attempts=row["attempts"],
                idempotency_key=row["key"],
                target=f"{URL}/a",
                ordering_key=row["ordering"],
            )
        else:
            self._event(
                at,
                "update",
                mid,
                "history-operator",
                xid=xid,
                old_state="dead",
                new_state="ready",
                old_attempts=row["attempts"],
                new_attempts=row["attempts"],
                ordering_key=row["ordering"],
            )
        self.finals[mid] = dataclasses.replace(self.finals[mid], state="ready")

    def deliver(self, claim: float, mid: int, app: str = "d1") -> None:
        """One whole delivery: claimed at ``claim``, arrived, answered, delivered."""
        self.claim(claim, mid, app)
        self.request(mid, claim + 0.01, claim + 0.05)
        self.end(claim + 0.1, mid, "delivered", app, start=claim + 0.005)

    def policy(
        self,
        before: float,
        cap: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
    ) -> None:
        first = not self.policies
        self.policies.append(
            PolicyChange(
                "a",
                cap,
                rate,
                burst,
                T0 + before - (100 if first else 0),
                T0 + before + 0.01 - (100 if first else 0),
            )
        )

    def breaker(
        self, at: float, old: str | None, new: str | None, until: float, xid: int | None = None
    ) -> None:
        self.health.append(
            HealthEvent(
                next(self.seq),
                T0 + at,
                T0 + at,
                next(self.xids) if xid is None else xid,
                "d1",
                "update",
                URL,
                old,
                new,
                self.health[-1].new_blocked_until if self.health else None,
                T0 + until,
            )
        )

    def history(self, **changes: Any) -> History:
        fields: dict[str, Any] = {
            "seed": 0,
            "timing": Timing(lease=2.0, request_timeout=1.0, claim_timeout=0.5),
            "destinations": tuple(self.destinations),
            "txns": tuple(self.txns),
            "requests": tuple(self.requests),
            "message_events": tuple(self.events),
            "health_events": tuple(self.health),
            "attempts": tuple(self.attempts),
            "finals": tuple(self.finals.values()),
            "effects": dict(self.effects),
            "processes": tuple(self.processes),
            "policies": tuple(self.policies),
        }
        fields.update(changes)
        return History(**fields)
