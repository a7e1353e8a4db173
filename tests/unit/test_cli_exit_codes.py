"""Every command says its exit status by name: each handler is declared to return
an :class:`~dispatchers.cli._exit.ExitCode` (which mypy then holds it to), and no
module of the command line returns a bare number, whose meaning a reader would
have to look up. Pure: reads the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dispatchers.cli._exit import ExitCode

CLI = Path(__file__).resolve().parents[2] / "dispatchers" / "cli"
MODULES = sorted(p for p in CLI.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_command_returns_a_bare_number(path: Path) -> None:
    literal = [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Return)
        and isinstance(node.value, ast.Constant)
        and type(node.value.value) is int
    ]
    assert literal == [], "return an ExitCode member instead"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_command_handler_is_declared_to_return_an_exit_code(path: Path) -> None:
    handlers = [f for f in functions(path) if f.name.startswith("cmd_")]
    wrong = [f.name for f in handlers if ast.unparse(f.returns or ast.Constant(None)) != "ExitCode"]
    assert wrong == []


def test_a_status_no_command_gives_is_a_failure() -> None:
    assert ExitCode.of_child(3) is ExitCode.DEAD_AFTER_DRAIN
    assert ExitCode.of_child(0) is ExitCode.OK
    assert ExitCode.of_child(-9) is ExitCode.FAILURE  # a child killed by SIGKILL
    assert ExitCode.of_child(120) is ExitCode.FAILURE
