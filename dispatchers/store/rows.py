"""Typed rows of the dispatcher's statements, their columns found by name.

psycopg's ``class_row`` and ``kwargs_row`` look every column up by name in every
row. On the claim that is measurable: a claim of 100 rows cost about 770 µs of the
dispatcher's CPU with its jobs made that way, 495 µs with them made by position
from tuples (decoding included), 2.7 µs more per message. :func:`columns` finds the
columns by name once per result and then reads each row by position (about 520 µs
per claim), so a statement's columns may come in any order, and one that lacks a
column fails when its first row is made.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from psycopg.rows import BaseRowFactory, RowMaker

R = TypeVar("R")
_Cursor = Any  # any psycopg cursor: the factory reads only its current result


def result_names(cursor: _Cursor) -> tuple[str, ...]:
    """The column names of the cursor's current result, read from the result itself:
    ``cursor.description`` makes a ``Column`` object per column at each call, which on
    a claim's 27 columns cost more of the dispatcher's CPU than the rest of its row
    factory (every result of a message is described, its ``set_config`` row too)."""
    result = cursor.pgresult
    if result is None:
        return ()
    return tuple((result.fname(i) or b"").decode() for i in range(result.nfields))


@functools.lru_cache(maxsize=256)
def taker(
    names: tuple[str, ...], fields: tuple[str, ...]
) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A function that takes ``fields``, in that order, out of a row whose columns
    are ``names``; one that fails naming what is missing if some field is."""
    missing = [field for field in fields if field not in names]
    if missing:

        def unfit(values: Sequence[Any]) -> tuple[Any, ...]:
            raise LookupError(f"the result has no column {', '.join(missing)} (it has {names})")

        return unfit
    positions = [names.index(field) for field in fields]
    if positions == list(range(len(names))):
        return tuple
    return lambda values: tuple(values[i] for i in positions)


def columns(cursor: _Cursor, fields: Sequence[str]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A function that takes ``fields``, in that order, out of a row of the cursor's
    current result (made once per set of names: a dispatcher runs a few statements,
    each always with the same columns)."""
    return taker(result_names(cursor), tuple(fields))


def named_row(cls: type[R]) -> BaseRowFactory[R]:
    """The row factory of the NamedTuple ``cls``: each row's columns of its fields."""
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]

    def factory(cursor: _Cursor) -> RowMaker[R]:
        take = columns(cursor, fields)
        return lambda values: cls(*take(values))

    return factory


class Renewed(NamedTuple):
    """A lease that ``renew`` extended."""

    id: int


class Completed(NamedTuple):
    """A row of ``complete`` and ``complete_delivered``: an outcome applied
    (``id``), or an endpoint the batch disabled and why."""

    id: int | None
    disabled_endpoint: int | None
    reason: str | None


class Recorded(NamedTuple):
    """A sent outcome that an earlier try of the same write recorded."""

    message_id: int


class Rescued(NamedTuple):
    """A message whose lease expired, and the state the rescuer gave it."""

    id: int
    state: str


class Removed(NamedTuple):
    """One retention batch: the history rows removed."""

    history: int


class Erased(NamedTuple):
    """A row of ``expire_payloads``: a retention rule served, and how many
    delivered messages' payloads it erased."""

    rule_id: int
    erased: int


class Partition(NamedTuple):
    """A row of ``history_partitions``: a partition of delivered or attempts and its
    range; ``lower`` None is MINVALUE (the legacy partition), and the default
    partition has neither bound."""

    parent: str
    partition: str
    lower: datetime | None
    upper: datetime | None
    is_default: bool


class Turned(NamedTuple):
    """The row of ``key_generation_turn``: the new generation, or None."""

    generation: int | None


class Carried(NamedTuple):
    """The row of ``key_generation_carry``: the messages read, or None when
    nothing was to be carried."""

    carried: int | None


class Made(NamedTuple):
    """A row of ``history_extend``: a partition made."""

    made: str


class Dropped(NamedTuple):
    """The row of ``history_drop``: whether the partition was dropped."""

    dropped: bool


class Backlog(NamedTuple):
    """A row of ``backlog``: a destination's ready messages due now, and how long
    the oldest has been due; destination None sums the destinations past the
    top ones."""

    destination: str | None
    ready: int
    oldest_s: float


class Remaining(NamedTuple):
    """The drain check: messages due now, in flight, and scheduled later."""

    due: int
    running: int
    scheduled: int


class LagAlerted(NamedTuple):
    """The answer of ``alert_lag``: ``exceeded`` or ``recovered`` when that call
    changed the lag's state (and raised the alert), else None."""

    changed: str | None


class KeyAlerted(NamedTuple):
    """The answer of ``alert_unknown_key``: the alert's messages (none when the
    alert of that key and hour was raised before, or no endpoint takes it)."""

    message_ids: list[int]


class SchemaAccess(NamedTuple):
    """The start-up check of the schema: whether it exists, whether the role may
    use it, and whether it may read its applied versions (None: no such table)."""

    schema_exists: bool
    usable: bool
    versions_readable: bool | None
    role: str


class MissingPrivilege(NamedTuple):
    """A privilege the dispatcher needs and its role lacks: on a table, or
    ``EXECUTE`` on a function (``table_name`` names the function)."""

    table_name: str
    privilege: str


class HealthRow(NamedTuple):
    """A destination's ``destination_health`` row as a transition left it."""

    destination: str
    state: str
    blocked_until: datetime
    failed_probes: int
