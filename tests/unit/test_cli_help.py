"""The command line documents itself, and the documentation documents it as it is.

Every command (groups included) has a description for its ``--help``, every
subcommand a line in its group's listing, and every option and argument a help
text. The option tables of the how-to guides (the one of ``outbox dispatch`` in
``docs/how-to/dispatcher.md``, the one of every other command in
``docs/how-to/operating.md``) list exactly the options the parser has, and every
option the README or a page shows with an ``outbox`` command line exists on that
command. Pure: builds the parser and reads the README and the pages.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from dispatchers.cli import build_parser
from tests.docs import all_docs_text, page

DISPATCH_OPTIONS = "how-to/dispatcher.md"
"""The page whose table lists the options of ``outbox dispatch``."""
COMMAND_OPTIONS = "how-to/operating.md"
"""The page whose table lists the options of every other command."""


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree (the root, groups, commands) with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def commands() -> dict[str, argparse.ArgumentParser]:
    """The commands that run something (no subcommands), by their name."""
    return {
        " ".join(path): parser
        for path, parser in parsers(build_parser())
        if path and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    }


def options(parser: argparse.ArgumentParser) -> set[str]:
    """A command's options by their long name, ``--help`` aside."""
    return {
        max(action.option_strings, key=len)
        for action in parser._actions
        if action.option_strings and "--help" not in action.option_strings
    }


def arguments(parser: argparse.ArgumentParser) -> set[str]:
    return {
        str(action.metavar or action.dest)
        for action in parser._actions
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
    }


def table(name: str, header: str) -> list[list[str]]:
    """The cells of the table of page ``name`` under ``header`` (its first row), row
    by row."""
    lines = page(name).splitlines()
    start = lines.index(header) + 2  # past the header and its --- row
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([cell.strip() for cell in cells])
    return rows


def code(cell: str) -> list[str]:
    """The code spans of a table cell."""
    return re.findall(r"`([^`]+)`", cell)


# -- help text ---------------------------------------------------------------------


def test_every_command_and_group_has_a_description() -> None:
    missing = [
        " ".join(("outbox", *path))
        for path, parser in parsers(build_parser())
        if not parser.description
    ]
    assert missing == []


def test_every_subcommand_has_a_line_in_its_groups_listing() -> None:
    missing = [
        " ".join(("outbox", *path, name))
        for path, parser in parsers(build_parser())
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
        if not next((c.help for c in action._choices_actions if c.dest == name), None)
    ]
    assert missing == []


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"outbox {' '.join(path)} {action.option_strings or action.dest}"
        for path, parser in parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_dispatch_help_names_the_metrics_and_health_endpoints() -> None:
    text = " ".join(commands()["dispatch"].format_help().split())
    for path in ("/metrics", "/healthz", "/livez"):
        assert path in text


# -- the docs against the parser -----------------------------------------------------


def test_the_dispatch_options_table_lists_exactly_its_options() -> None:
    header = "| option | default | meaning |"
    listed = {code(row[0])[0].split()[0] for row in table(DISPATCH_OPTIONS, header)}
    assert listed == options(commands()["dispatch"])


def test_the_command_table_lists_every_command_with_exactly_its_options() -> None:
    header = "| command | arguments | options |"
    rows = {code(row[0])[0]: row for row in table(COMMAND_OPTIONS, header)}
    parsed = commands()
    assert set(rows) == set(parsed)
    for name, parser in parsed.items():
        if name == "dispatch":
            continue  # its own table, above
        _, args, opts = rows[name]
        assert {a.removesuffix("...") for a in code(args)} == arguments(parser), name
        assert set(code(opts)) == options(parser), name


def documented_command_lines() -> list[str]:
    """Every ``outbox ...`` command line the README and the pages show, in code
    blocks (their comments included) or inline, without a comment that follows it."""
    text = all_docs_text()
    blocks = re.findall(r"^ *```[a-z]*\n(.*?)^ *```$", text, flags=re.M | re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`([^`\n]*outbox [^`]+)`", text)
    found = []
    for line in lines:
        start = line.find("outbox ")
        if start >= 0 and (start == 0 or line[start - 1] in " (/$"):
            found.append(line[start:].split(" #", 1)[0].strip())
    return found


def test_every_option_the_docs_show_on_a_command_line_exists() -> None:
    parsed = commands()
    groups = {name.split()[0] for name in parsed}
    wrong = []
    for line in documented_command_lines():
        words = line.split()
        if len(words) < 2 or words[1] not in groups:
            continue  # prose such as "outbox schema", not a command line
        name = " ".join(words[1:3]) if " ".join(words[1:3]) in parsed else words[1]
        if name not in parsed:
            continue  # a group named alone ("outbox db")
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line):
            if flag not in options(parsed[name]) | {"--help"}:
                wrong.append(f"{line!r}: {flag}")
    assert wrong == []
