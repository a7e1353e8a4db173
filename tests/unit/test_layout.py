"""The tree keeps its shape: modules stay small or say why not, and the layers
contract of the runtime places every one of its parts."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 400


def test_a_long_module_says_in_its_docstring_why_it_stays_whole() -> None:
    long = []
    for path in sorted(
        [*ROOT.joinpath("outbox").rglob("*.py"), *ROOT.joinpath("dispatchers").rglob("*.py")]
    ):
        text = path.read_text()
        if len(text.splitlines()) > MOST_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "stays whole" not in doc:
                long.append(str(path.relative_to(ROOT)))
    assert long == []


def test_the_layers_contract_places_every_part_of_the_runtime() -> None:
    config = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert layers["containers"] == ["dispatchers"]
    named = {
        part.strip() for layer in layers["layers"] for part in layer.replace(":", "|").split("|")
    }
    parts = {
        p.stem if p.is_file() else p.name
        for p in ROOT.joinpath("dispatchers").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert named == parts
    assert layers["layers"][0] == "cli"  # on top: nothing of the runtime imports it


ENVIRONMENT = ("environ", "environb", "getenv", "getenvb")


@pytest.mark.slow
def test_environment_variables_are_read_in_one_module() -> None:
    # dispatchers/environment.py reads them all; a child process may be given a
    # copy of the environment ({**os.environ, ...}), which reads nothing itself
    readers = []
    for path in sorted(
        [*ROOT.joinpath("outbox").rglob("*.py"), *ROOT.joinpath("dispatchers").rglob("*.py")]
    ):
        if path == ROOT / "dispatchers" / "environment.py":
            continue
        tree = ast.parse(path.read_text())
        copied = {
            id(value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Dict)
            for key, value in zip(node.keys, node.values, strict=True)
            if key is None
        }
        for node in ast.walk(tree):
            reads = isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT
            if reads and id(node) not in copied:
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert readers == []


def test_the_runtime_is_kept_from_every_private_module_of_the_library() -> None:
    config = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())
    (contract,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and c["source_modules"] == ["dispatchers"]
    ]
    private = {
        f"outbox.{p.stem}" for p in ROOT.joinpath("outbox").glob("_*.py") if p.stem != "__init__"
    }
    assert set(contract["forbidden_modules"]) == private
