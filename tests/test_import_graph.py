"""Imports flow one way: clusterfed's import graph, read from the source with ``ast``, has no
cycle, ``strategies/`` never imports ``runner/``, and a function-local import only keeps a
heavy dependency lazy.

Module-level, function-local and ``if TYPE_CHECKING:`` imports alike are edges: a
function-local import hides a cycle from Python at import time, and a TYPE_CHECKING one a
dependency that only type checkers follow, not from the design.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``;
relative imports are resolved.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "clusterfed"

# What a function-local import may keep lazy: the packages a server, a device or a plain
# `import clusterfed` must not pay for until a code path needs them (torch and torchvision on
# a server, scipy/scikit-learn/matplotlib/ray on a device, the Hugging Face readers unless
# such a data set is asked for), plus two parts of Flower that only some paths use (its
# simulation engine, which loads Ray, and the SuperLink's in-memory grid).
HEAVY = ("torch", "torchvision", "matplotlib", "ray", "scipy", "sklearn", "datasets", "flwr_datasets", "PIL",
         "flwr.simulation", "flwr.superlink",
         "tensorboardX", "mlflow")  # optional extras (log-to), imported only when asked for

def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _owner(name: str) -> str:
    """The clusterfed module that ``name`` (a module or an attribute path) lives in."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> tuple[list[str], list[str]]:
    """(clusterfed modules, other top-level names) that an import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [_owner(n) for n in names if n.split(".")[0] == "clusterfed"], [n for n in names if n.split(".")[0] != "clusterfed"]
    if node.level:
        base = module.split(".")[: len(module.split(".")) - (node.level - (1 if is_package else 0))]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source.split(".")[0] != "clusterfed":
        return [], [source]
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else _owner(source) for a in node.names], []


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Imports under ``if TYPE_CHECKING:``: read by type checkers, never run by Python."""
    return {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING" for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}


def _function_local(tree: ast.Module) -> set[int]:
    return {id(sub) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for sub in ast.walk(fn) if isinstance(sub, (ast.Import, ast.ImportFrom))}


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]], list[tuple[str, int, list[str], list[str]]]]:
    """(every edge, TYPE_CHECKING ones included; the module-level edges Python runs; the
    function-local imports as (module, line, clusterfed targets, others))."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    top: dict[str, set[str]] = {m: set() for m in MODULES}
    local = []
    for module, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        in_functions, not_run = _function_local(tree), _type_checking_only(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            ours, others = imported(module, is_package, node)
            if id(node) in not_run:  # typing only: an edge all the same
                edges[module].update(t for t in ours if t != module)
                continue
            edges[module].update(t for t in ours if t != module)
            if id(node) in in_functions:
                local.append((module, node.lineno, ours, others))
            elif node in tree.body:
                top[module].update(t for t in ours if t != module)
    return edges, top, local


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _is_heavy(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HEAVY)


def heavy_at_import(top: dict[str, set[str]]) -> dict[str, bool]:
    """Whether importing each module loads a heavy package (itself or through module-level imports)."""
    own = {}
    for module, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        own[module] = any(_is_heavy(name) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                          for name in imported(module, is_package, node)[1])
    result: dict[str, bool] = {}

    def heavy(m: str, seen: frozenset = frozenset()) -> bool:
        if m not in result:
            result[m] = own[m] or any(heavy(t, seen | {m}) for t in top[m] if t not in seen)
        return result[m]

    return {m: heavy(m) for m in MODULES}


EDGES, TOP, LOCAL = import_graph()


def test_the_graph_reads_the_package():
    assert len(MODULES) > 50 and "clusterfed.strategies.base" in EDGES["clusterfed.strategies.fedclust"]
    assert "clusterfed.models.parameters" in EDGES["clusterfed.models.layers"]  # a relative import resolved


def test_no_import_cycle():
    assert cycles(EDGES) == [], "import cycle(s)"


def test_the_strategies_never_import_the_runner():
    """Not at run time, not lazily, not for type checkers: a strategy reaches the runner through
    ``clusterfed.strategy_protocol.runner()``, which loads it by its import path."""
    strategies = [m for m in MODULES if m == "clusterfed.strategies" or m.startswith("clusterfed.strategies.")]
    found = {m: sorted(t for t in EDGES[m] if t == "clusterfed.runner" or t.startswith("clusterfed.runner."))
             for m in strategies}
    assert {m: t for m, t in found.items() if t} == {}


def test_type_checking_imports_are_edges():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clusterfed.strategies import base\n")
    assert _type_checking_only(tree) and all(
        imported("clusterfed.runner.driver", False, node)[0] == ["clusterfed.strategies.base"]
        for node in ast.walk(tree) if id(node) in _type_checking_only(tree))
    assert "clusterfed.clustering.distances" in EDGES["clusterfed.strategies"]  # the author kit's TYPE_CHECKING import


def test_function_local_imports_only_keep_heavy_packages_lazy():
    heavy = heavy_at_import(TOP)
    hidden = []
    for module, line, ours, others in LOCAL:
        if all(_is_heavy(name) for name in others) and all(heavy[t] for t in ours):
            continue
        hidden.append(f"{module}:{line} imports {', '.join(ours + others)}")
    assert hidden == [], "move these imports to module level (they keep nothing heavy lazy)"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("source, expected", [
    ("from clusterfed.models import layers", ["clusterfed.models.layers"]),
    ("from clusterfed.models import build_model", ["clusterfed.models"]),
    ("import clusterfed.strategies.base", ["clusterfed.strategies.base"]),
    ("from .parameters import trainable_names", ["clusterfed.models.parameters"]),
    ("from . import parameters", ["clusterfed.models.parameters"]),
])
def test_imports_resolve_to_modules(source, expected):
    node = ast.parse(source).body[0]
    assert imported("clusterfed.models.layers", False, node)[0] == expected
