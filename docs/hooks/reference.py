"""The generated reference: each page's ``<!-- reference:NAME -->`` line becomes the
markdown that :data:`RENDERERS` makes from the code, at build time.

- ``cli``: every ``outbox`` command, from the argparse parsers
  (:func:`dispatchers.cli.build_parser`): description, usage, arguments and options
  with their defaults and help;
- ``configuration``: every field of :class:`~dispatchers.runtime.config.DispatcherConfig`,
  its default and the ``outbox dispatch`` option made from its metadata;
- ``openapi``: the management API's OpenAPI document (``docs/reference/openapi.json``
  when it is there, else the one :func:`dispatchers.api.openapi.document` makes):
  operations, parameters, bodies, answers and schemas;
- ``exit-statuses``: the members of :class:`dispatchers.cli._exit.ExitCode` with
  their docstrings;
- ``metrics``: every Prometheus instrument the runtime defines, found in its source.

Nothing is written to ``docs/``: the pages hold the placeholder, the site the result.
The Python API's pages are mkdocstrings' (``::: outbox.Outbox``); this hook only
shows the Sphinx roles of their docstrings as plain code.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "docs" / "reference" / "openapi.json"
PLACEHOLDER = re.compile(r"^<!-- reference:([\w-]+) -->$", flags=re.M)


def cell(text: object) -> str:
    """``text`` fit for a markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """``text`` as a code span, backquotes inside it allowed."""
    text = str(text)
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# -- the command line -------------------------------------------------------------


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, dict[str, str]]]:
    """Every parser of the tree with its path and its subcommands' one-line help."""
    listing: dict[str, str] = {}
    subs: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                listing[name] = helps.get(name, "")
                subs.append((name, sub))
    yield path, parser, listing
    for name, sub in subs:
        yield from _commands(sub, (*path, name))


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return ""
    if action.default in (None, argparse.SUPPRESS) or action.default == []:
        return ""
    return code(action.default)


def render_cli() -> str:
    from dispatchers.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # the usage lines' width, whatever the terminal
    try:
        root = build_parser()
        out = [
            "Every command, as its `--help` says it (`outbox --help`, or `--help` after",
            "any command).",
            "",
        ]
        for path, parser, listing in _commands(root):
            name = " ".join(("outbox", *path))
            out += [f"## `{name}`", ""]
            if parser.description:
                out += [parser.description.strip(), ""]
            out += ["```", parser.format_usage().strip(), "```", ""]
            if listing:
                out += ["| command | what it does |", "| --- | --- |"]
                out += [f"| `{name} {sub}` | {cell(text)} |" for sub, text in listing.items()]
                out.append("")
            formatter = parser._get_formatter()
            rows = []
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                    continue
                if action.option_strings:
                    spelt = ", ".join(action.option_strings)
                    if action.nargs != 0:
                        spelt += " " + formatter._format_args(
                            action, formatter._get_default_metavar_for_optional(action)
                        )
                else:
                    spelt = formatter._format_args(
                        action, formatter._get_default_metavar_for_positional(action)
                    )
                help_text = formatter._expand_help(action) if action.help else ""
                rows.append(f"| {code(spelt)} | {_default(action)} | {cell(help_text)} |")
            if rows:
                out += ["| argument or option | default | meaning |", "| --- | --- | --- |"]
                out += [*rows, ""]
        return "\n".join(out)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


# -- the dispatcher's settings ----------------------------------------------------


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple) and not value:
        return "()"
    return str(value)


def render_configuration() -> str:
    from dispatchers.runtime.config import DispatcherConfig

    out = [
        "| setting | default | `outbox dispatch` option | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for f in dataclasses.fields(DispatcherConfig):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        option = f.metadata.get("option")
        flag = help_text = ""
        if option is not None:
            flag = option.flag or "--" + f.name.replace("_", "-")
            if isinstance(default, bool) and default:
                flag = "--no-" + flag.removeprefix("--")
            help_text = option.help
            shown = option.default or _shown(default)
        else:
            shown = _shown(default)
            kind = f.metadata.get("kind")
            help_text = f"no option ({kind})" if kind else "no option"
        if isinstance(default, bool | tuple) and option is not None:
            shown = _shown(default)
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", f.type)
        out.append(
            f"| `{f.name}`: {cell(code(annotation))} | {cell(code(shown))} "
            f"| {code(flag) if flag else ''} | {cell(help_text)} |"
        )
    return "\n".join(out)


# -- the management API ------------------------------------------------------------


def _openapi() -> dict[str, Any]:
    if OPENAPI.exists():
        loaded: dict[str, Any] = json.loads(OPENAPI.read_text(encoding="utf-8"))
        return loaded
    from dispatchers.api.openapi import document
    from dispatchers.api.routes import ROUTES

    return document(ROUTES)


def _schema_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^\w-]", "-", name).lower()


def _type(schema: dict[str, Any] | bool) -> str:
    """A JSON Schema in a few words, linking the schemas it names."""
    if not isinstance(schema, dict):
        return "any"
    if "$ref" in schema:
        name = _schema_name(schema["$ref"])
        return f"[{name}](#{_anchor(name)})"
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in schema:
            return " or ".join(_type(s) for s in schema[combinator])
    if "enum" in schema:
        return "one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(_type({**schema, "type": k}) for k in kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"object of {_type(extra)}" if isinstance(extra, dict) else "object"
    if "format" in schema:
        return f"{kind} ({schema['format']})"
    return str(kind)


def _bounds(schema: dict[str, Any]) -> str:
    words = {
        "minimum": "at least",
        "exclusiveMinimum": "above",
        "maximum": "at most",
        "exclusiveMaximum": "below",
        "minLength": "length at least",
        "maxLength": "length at most",
        "minItems": "items at least",
        "maxItems": "items at most",
        "pattern": "matches",
    }
    found = [f"{word} {code(schema[key])}" for key, word in words.items() if key in schema]
    if "default" in schema:
        found.append(f"default {code(json.dumps(schema['default']))}")
    return "; ".join(found)


def _describe(schema: dict[str, Any]) -> str:
    parts = [schema.get("description", "")]
    bounds = _bounds(schema)
    if bounds:
        parts.append(f"({bounds})")
    return cell(" ".join(p for p in parts if p))


def render_openapi() -> str:
    doc = _openapi()
    info = doc.get("info", {})
    out = [
        f"OpenAPI {doc.get('openapi', '')}, version {info.get('version', '')}: "
        f"the document `outbox ui` serves at `/api/v1/openapi.json`.",
        "",
    ]
    if info.get("description"):
        out += [info["description"].strip(), ""]
    servers = [s.get("url", "") for s in doc.get("servers", [])]
    if servers:
        out += ["Paths are relative to " + ", ".join(code(s) for s in servers) + ".", ""]
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            if method not in ("get", "put", "post", "patch", "delete"):
                continue
            out += [f"## `{method.upper()} {path}`", ""]
            if operation.get("summary"):
                out += [operation["summary"].strip() + ".", ""]
            if operation.get("description"):
                out += [operation["description"].strip(), ""]
            tags = operation.get("tags", [])
            scopes = "none" if operation.get("security") == [] else "a bearer token"
            out += [
                f"Operation `{operation.get('operationId', '')}`"
                + (f", tag {', '.join(code(t) for t in tags)}" if tags else "")
                + f"; authentication: {scopes}.",
                "",
            ]
            parameters = operation.get("parameters", [])
            if parameters:
                out += [
                    "| parameter | in | required | type | description |",
                    "| --- | --- | --- | --- | --- |",
                ]
                for p in parameters:
                    schema = p.get("schema", {})
                    description = p.get("description") or schema.get("description", "")
                    bounds = _bounds(schema)
                    out.append(
                        f"| `{p['name']}` | {p.get('in', '')} | "
                        f"{'yes' if p.get('required') else 'no'} | {cell(_type(schema))} | "
                        f"{cell(description)}{' (' + bounds + ')' if bounds else ''} |"
                    )
                out.append("")
            body = operation.get("requestBody")
            if body:
                for media, content in body.get("content", {}).items():
                    required = "required" if body.get("required") else "optional"
                    out += [
                        f"Request body ({required}, `{media}`): "
                        f"{_type(content.get('schema', {}))}.",
                        "",
                    ]
            responses = operation.get("responses", {})
            if responses:
                out += ["| status | meaning | body |", "| --- | --- | --- |"]
                for status, answer in responses.items():
                    bodies = [
                        f"`{media}` {_type(c.get('schema', {}))}"
                        for media, c in answer.get("content", {}).items()
                    ]
                    out.append(
                        f"| `{status}` | {cell(answer.get('description', ''))} | "
                        f"{cell(', '.join(bodies))} |"
                    )
                out.append("")
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out += ["## Schemas", ""]
        for name, schema in schemas.items():
            out += [f"### {name} {{ #{_anchor(name)} }}", ""]
            if schema.get("description"):
                out += [schema["description"].strip(), ""]
            properties = schema.get("properties", {})
            needed = set(schema.get("required", []))
            if properties:
                out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
                for field, prop in properties.items():
                    out.append(
                        f"| `{field}` | {cell(_type(prop))} | "
                        f"{'yes' if field in needed else 'no'} | {_describe(prop)} |"
                    )
                out.append("")
            elif "type" in schema or "enum" in schema or "anyOf" in schema:
                out += [f"{_type(schema)}.", ""]
    return "\n".join(out)


# -- exit statuses -------------------------------------------------------------------


def _attribute_docstrings(path: Path, class_name: str) -> list[tuple[str, Any, str]]:
    """The attributes of ``class_name`` in ``path``: name, value and docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    found = []
    body = cls.body
    for node, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                doc = ""
                if (
                    isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    doc = after.value.value
                found.append((target.id, ast.literal_eval(node.value), doc))
    return found


def render_exit_statuses() -> str:
    out = ["| status | name | meaning |", "| --- | --- | --- |"]
    path = ROOT / "dispatchers" / "cli" / "_exit.py"
    for name, value, doc in _attribute_docstrings(path, "ExitCode"):
        text = re.sub(r"``([^`]+)``", r"`\1`", doc)
        text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
        out.append(f"| {value} | `{name}` | {cell(text)} |")
    return "\n".join(out)


# -- metrics -----------------------------------------------------------------------

_EXPOSED = {
    "Counter": ["_total"],
    "Gauge": [""],
    "Histogram": ["_bucket", "_sum", "_count"],
}


def _instruments() -> Iterator[tuple[str, str, str, list[str], str]]:
    """Every Prometheus instrument made in ``dispatchers/``: kind, name,
    documentation, labels and the module that makes it."""
    for path in sorted((ROOT / "dispatchers").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in _EXPOSED or len(node.args) < 2:
                continue
            try:
                name = ast.literal_eval(node.args[0])
                documentation = ast.literal_eval(node.args[1])
            except ValueError:
                continue
            labels: list[str] = []
            if len(node.args) > 2:
                labels = list(ast.literal_eval(node.args[2]))
            for keyword in node.keywords:
                if keyword.arg == "labelnames":
                    labels = list(ast.literal_eval(keyword.value))
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield node.func.id, name, documentation, labels, module


def render_metrics() -> str:
    out = [
        "| metric | type | labels | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for kind, name, documentation, labels, module in _instruments():
        names = "<br>".join(f"`{name}{suffix}`" for suffix in _EXPOSED[kind])
        shown = ", ".join(f"`{label}`" for label in labels)
        out.append(f"| {names} | {kind.lower()} | {shown} | {cell(documentation)} (`{module}`) |")
    return "\n".join(out)


RENDERERS: dict[str, Callable[[], str]] = {
    "cli": render_cli,
    "configuration": render_configuration,
    "openapi": render_openapi,
    "exit-statuses": render_exit_statuses,
    "metrics": render_metrics,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs' hook: each placeholder replaced by what its renderer makes."""

    def render(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in RENDERERS:
            raise KeyError(f"no reference renderer named {name!r}")
        return RENDERERS[name]()

    return PLACEHOLDER.sub(render, markdown)


ROLE = re.compile(
    r":(?:class|func|meth|mod|attr|data|exc|obj|const|envvar):<code>(~?)([^<]*)</code>"
)
"""A Sphinx cross-reference role left in a docstring, as markdown renders it."""


def on_page_content(html: str, **kwargs: Any) -> str:
    """MkDocs' hook: the docstrings' Sphinx roles (``:class:`~outbox.Outbox```) shown
    as the code they name (``Outbox``), without the role's markup."""

    def plain(match: re.Match[str]) -> str:
        name = match.group(2)
        return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"

    return ROLE.sub(plain, html)
