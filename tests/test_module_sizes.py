"""Modules stay small enough to read. A module is as long as its one idea: about 400 lines is
the guidance (for the reader, not enforced: splitting an idea to meet a
count scatters it), and ``MAX_MODULE_LINES`` is the ceiling past which a module holds more
than one idea; no function over 80 lines.

``OVERSIZED`` lists modules past the ceiling, with their size when listed: a module may not
grow past it, a new module may not join the list, and one that has been split must leave it
(so the list only shrinks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "clusterfed"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# module -> its line count when listed; functions -> theirs
OVERSIZED: dict[str, int] = {}
LONG_FUNCTIONS: dict[str, int] = {}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", modules(), ids=name)
def test_module_and_function_sizes(path):
    lines = len(path.read_text().splitlines())
    limit = OVERSIZED.get(name(path), MAX_MODULE_LINES)
    assert lines <= limit, f"{name(path)}: {lines} lines (at most {limit}): split it by concern"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            key = f"{name(path)}:{node.name}"
            assert length <= LONG_FUNCTIONS.get(key, MAX_FUNCTION_LINES), f"{key}: {length} lines"


def test_the_oversized_lists_only_shrink():
    sizes = {name(p): len(p.read_text().splitlines()) for p in modules()}
    assert [m for m in OVERSIZED if sizes.get(m, 0) <= MAX_MODULE_LINES] == [], "split: take it off OVERSIZED"
    functions = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{name(path)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert [f for f in LONG_FUNCTIONS if functions.get(f, 0) <= MAX_FUNCTION_LINES] == [], \
        "shortened: take it off LONG_FUNCTIONS"
