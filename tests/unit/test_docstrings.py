"""A module's docstring says what the module is and the invariants it keeps, in a few
lines; why it is built so is told in the design pages of the documentation."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "explanation" / "design"
MOST_LINES = 15
MOST_LINES_PACKAGE = 30  # an __init__.py may list what its package holds
# outbox/errors.py draws the error tree, one line per class (test_error_tree.py holds
# the drawing to the classes): the lines of the drawing do not count
TREE = "The tree::"


def modules() -> list[Path]:
    return sorted(
        [*ROOT.joinpath("outbox").rglob("*.py"), *ROOT.joinpath("dispatchers").rglob("*.py")]
    )


def docstring(path: Path) -> ast.Expr | None:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[0]
    return None


def drawn_tree_lines(text: str) -> int:
    """The lines of the literal block that follows ``The tree::``, blank ones included."""
    if TREE not in text:
        return 0
    block = text.split(TREE, 1)[1].splitlines()[1:]
    count = 0
    for line in block:
        if line.strip() and not line.startswith(" "):
            break
        count += 1
    while count and not block[count - 1].strip():
        count -= 1
    return count


def docstring_lines(path: Path) -> int:
    node = docstring(path)
    if node is None:
        return 0
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    if path.relative_to(ROOT).as_posix() == "outbox/errors.py":
        lines -= drawn_tree_lines(str(ast.literal_eval(node.value)))
    return lines


def test_every_module_docstring_is_a_few_lines() -> None:
    long = []
    for path in modules():
        limit = MOST_LINES_PACKAGE if path.name == "__init__.py" else MOST_LINES
        lines = docstring_lines(path)
        if lines > limit:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines (at most {limit})")
    assert long == [], "module docstrings too long:\n" + "\n".join(long)


def test_a_docstring_points_at_a_design_page_that_exists() -> None:
    missing = []
    for path in modules():
        node = docstring(path)
        text = str(ast.literal_eval(node.value)) if node else ""
        for page in re.findall(r"Design: (docs/explanation/design/[\w./-]+\.md)", text):
            if not ROOT.joinpath(page).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {page}")
    assert missing == []


def test_the_design_index_lists_every_design_page() -> None:
    index = DESIGN.joinpath("index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    pages = {path.name for path in DESIGN.glob("*.md")} - {"index.md"}
    assert listed == pages


def test_the_design_pages_link_only_to_pages_that_exist() -> None:
    broken = []
    for page in sorted(DESIGN.glob("*.md")):
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text("utf-8")):
            if not page.parent.joinpath(target).is_file():
                broken.append(f"{page.name}: {target}")
    assert broken == []
