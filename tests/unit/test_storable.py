"""Text and JSON that PostgreSQL can store, checked before any statement is sent:
what is refused, under which error class, and how the problem says where."""

from __future__ import annotations

import pytest

from outbox._storable import check_json, check_text, text_problem
from outbox.errors import InvalidArgument, InvalidMessage

SURROGATE = "\udc80"  # what Python makes of the byte 0x80 of a non-UTF-8 argv


def test_a_nul_character_is_found_at_its_first_place() -> None:
    assert text_problem("ab\x00c\x00") == "holds a NUL character (\\x00) at character 3"


def test_a_lone_surrogate_is_found_at_its_place() -> None:
    assert text_problem(f"a{SURROGATE}b") == (
        "holds a lone surrogate ('\\udc80') at character 2: "
        "not Unicode text (bytes that are not UTF-8?)"
    )


def test_text_postgresql_can_store_has_no_problem() -> None:
    assert text_problem("plain, and ünïcode too") is None
    assert check_text("fine", "description") == "fine"


@pytest.mark.parametrize("error", [InvalidMessage, InvalidArgument])
def test_check_text_raises_the_error_class_asked_for_naming_the_field(
    error: type[InvalidArgument],
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_text("a\x00b", "description", error=error)
    assert type(refused.value) is error
    assert refused.value.field == "description"
    assert str(refused.value) == "description: holds a NUL character (\\x00) at character 2"


def test_a_string_at_the_top_is_named_so() -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_json("a\x00", "metadata", max_values=10)
    assert str(refused.value) == (
        "metadata: holds a NUL character (\\x00) at character 2 in the string at the top"
    )


def test_every_string_of_a_level_is_checked_after_a_good_one() -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_json(["fine", "ba\x00d"], "metadata", max_values=10)
    assert refused.value.problem.endswith("in the string at [1]")


def test_values_are_counted_up_to_the_bound_the_top_one_included() -> None:
    check_json([1, 2, 3], "metadata", max_values=4)  # the list and its three items
    with pytest.raises(InvalidMessage) as refused:
        check_json([1, 2, 3], "metadata", max_values=3)
    assert str(refused.value) == "metadata: holds more than 3 values"


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("k" * 18, "'" + "k" * 18 + "'"),  # 20 characters quoted: shown whole
        ("k" * 19, "'" + "k" * 16 + "..."),  # 21: cut at 17, and marked
    ],
)
def test_a_long_key_is_cut_where_a_path_shows_it(key: str, shown: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_json({key: "a\x00"}, "metadata", max_values=10)
    assert refused.value.problem.endswith(f"in the string at [{shown}]")


def test_a_bad_key_is_named_by_its_path() -> None:
    with pytest.raises(InvalidMessage) as refused:
        check_json({"a": [{"b\x00": 1}]}, "metadata", max_values=10)
    assert str(refused.value) == (
        "metadata: holds a NUL character (\\x00) at character 2 in the key at ['a'][0]['b\\x00']"
    )
