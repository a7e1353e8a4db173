"""The bases of the management API's models, and how they read a value.

What a model accepts is what its schema allows, no more and no less: JSON
types as they are (an integer is any number without a fraction, ``147.0``
too; a number is never a string), a date-time in the form its schema's pattern
gives, and a path or query parameter whose schema is not a string read as the
JSON text of its value (``limit=50``, ``enabled=true``).
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

__all__ = ["INSTANT_PATTERN", "INTEGRAL", "Input", "Output", "Parameters", "parse_instant"]

INSTANT_PATTERN = (
    r"^(19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])"
    r"-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
"""An RFC 3339 date-time of the years 1970 to 9998 (which the database and
Python's arithmetic both hold whatever the offset), to the microsecond, as the
document's pattern (ECMA 262 and Python read it alike: ASCII digits only)."""

INSTANT_RE = re.compile(INSTANT_PATTERN)


def parse_instant(value: object) -> datetime:
    """A date-time as :data:`INSTANT_PATTERN` writes it, parsed; anything else
    (a number, a time without seconds or offset, a date that does not exist)
    is refused."""
    problem = "must be an RFC 3339 date-time from 1970 to 9998, as 2024-05-01T12:00:00Z"
    if not isinstance(value, str) or INSTANT_RE.fullmatch(value) is None:
        raise ValueError(problem)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(problem) from None


def _integral(value: object) -> object:
    """A number without a fraction as the integer it is (JSON Schema's
    ``integer`` is such a number, ``147.0`` as much as ``147``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_integral)
"""Given after an integer's bounds (``Annotated[int, Field(ge=...), INTEGRAL]``):
before them, the bounds would not reach the schema as ``minimum`` and
``maximum``."""


class Input(BaseModel):
    """What a request may hold: nothing it does not name."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _no_null_where_not_clearable(self) -> Input:
        for name in self.model_fields_set:
            if getattr(self, name) is None and name not in self.clearable():
                raise ValueError(f"{name}: must not be null")
        return self

    @classmethod
    def clearable(cls) -> frozenset[str]:
        """The fields that ``null`` clears."""
        return frozenset()


class Parameters(Input):
    """A request's path or query parameters: text, each read as the JSON text
    of its value where its schema is not a string, then checked as strictly as
    a body."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _read_as_json(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        typed = _typed_parameters(cls)
        return {
            name: _json_value(value) if name in typed and isinstance(value, str) else value
            for name, value in data.items()
        }


@functools.cache
def _typed_parameters(model: type[BaseModel]) -> frozenset[str]:
    """The parameters of ``model`` whose schema is not a string's."""
    properties = model.model_json_schema()["properties"]
    return frozenset(name for name, schema in properties.items() if "string" not in _types(schema))


def _types(schema: dict[str, Any]) -> set[str]:
    kinds = schema.get("type", ())
    found = {kinds} if isinstance(kinds, str) else set(kinds)
    for member in schema.get("anyOf", ()):
        found |= _types(member)
    return found


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_value(text: str) -> Any:
    """The JSON value ``text`` is; ``text`` itself (which a typed field refuses)
    if it is not JSON, has space around it, or is null (a parameter left out
    is not given at all)."""
    if text != text.strip():
        return text
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        return text
    return text if value is None else value


class Output(BaseModel):
    """What a response holds. Made from the library's values, which may carry
    more than the API shows: what a model does not name is left out."""

    model_config = ConfigDict(extra="ignore")
