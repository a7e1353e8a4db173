"""``outbox endpoints add`` and ``update`` turn their options into the keyword
arguments of ``Endpoints.add`` and ``update``: every option of ``update`` that
changes a setting is known to the check that something changes, options that
set and remove one setting are refused together, and the values pass through.
Pure: builds the parser and parses command lines."""

from __future__ import annotations

import argparse
import re

import pytest

from dispatchers.cli import build_parser
from dispatchers.cli._common import UsageError
from dispatchers.cli._endpoint_settings import _EXCLUSIVE, _UPDATE_OPTIONS, settings

NOT_SETTINGS = {"--database-url", "--schema", "--json", "--secrets-key-file"}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["endpoints", *argv])


def update_options() -> set[str]:
    parser = build_parser()
    group = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    endpoints = group.choices["endpoints"]
    actions = next(a for a in endpoints._actions if isinstance(a, argparse._SubParsersAction))
    return {
        max(action.option_strings, key=len)
        for action in actions.choices["update"]._actions
        if action.option_strings and "--help" not in action.option_strings
    }


def test_every_option_of_update_but_the_connections_is_a_setting() -> None:
    assert set(_UPDATE_OPTIONS) == update_options() - NOT_SETTINGS


def test_an_update_without_a_setting_names_every_option_it_could_take() -> None:
    with pytest.raises(UsageError) as refused:
        settings(parse("update", "7"), update=True)
    named = set(re.findall(r"--[a-z0-9-]+", str(refused.value)))
    assert named == set(_UPDATE_OPTIONS)


@pytest.mark.parametrize(("setters", "remover"), _EXCLUSIVE)
def test_setting_and_removing_one_setting_together_is_refused(
    setters: tuple[str, ...], remover: str
) -> None:
    values = {"--event-type": "a", "--max-concurrency": "2", "--rate-limit": "5", "--burst": "2"}
    values |= {"--filter": "a", "--retry-schedule": "5s"}
    # checked before any file is read
    values |= {"--header": "X-Api-Key: k", "--basic-auth": "u:p", "--basic-auth-file": "f"}
    values |= {"--bearer-token-file": "f", "--oauth2-token-url": "https://a.example/token"}
    values |= {"--oauth2-client-id": "c", "--oauth2-client-secret-file": "f"}
    for setter in setters:
        argv = ["update", "7", setter, values[setter], remover]
        with pytest.raises(UsageError, match=f"{re.escape(setter)}.* or {remover}, not both"):
            settings(parse(*argv), update=True)


def test_the_values_given_reach_the_keyword_arguments() -> None:
    chosen = settings(
        parse("update", "7", "--all-event-types", "--metadata", '{"team": "a"}', "--burst", "3"),
        update=True,
    )
    assert chosen["event_types"] == [] and chosen["metadata"] == {"team": "a"}
    assert chosen["burst"] == 3 and chosen["rate_limit"] is None
    assert chosen["clear_filter"] is False and chosen["url"] is None
    added = settings(
        parse("add", "https://example.com/h", "--retry-schedule", "5s,1m"), update=False
    )
    assert added["retry_schedule"] == (5.0, 60.0) and added["event_types"] is None
    assert "url" not in added and "clear_filter" not in added
