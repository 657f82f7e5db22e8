"""How the strategies are built, measured from the source: for every registered strategy, its
classes between it and Flower's ``Strategy`` (the MRO), the lines of its own module, and the
clusterfed modules its module reaches through imports inside ``strategies/``, ``core/`` (the
vocabulary every strategy speaks and its Flower face), ``clustering/`` and ``models/`` (what a
reader has to open to know the algorithm), and of those the ones inside ``strategies/`` and inside
``core/``; for the package, the import cycles (``TYPE_CHECKING`` imports counted as edges), the
edges from ``strategies/`` to ``runner/``, the ``typing.Protocol`` classes and the module
``__getattr__`` hooks (lazy loading).

    python scripts/house_metrics.py > metrics.json
"""

from __future__ import annotations

import ast
import json
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clusterfed"
KNOWLEDGE = ("clusterfed.strategies", "clusterfed.core", "clusterfed.clustering", "clusterfed.models")


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = modules()


def owner(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def edges_of(module: str) -> set[str]:
    """Every clusterfed module ``module`` imports: module level, function-local or under TYPE_CHECKING."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(owner(a.name) for a in node.names if a.name.startswith("clusterfed"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - (node.level - (1 if is_package else 0))]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.startswith("clusterfed"):
                found.update(f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else owner(source)
                             for a in node.names)
    found.discard(module)
    found.discard("")
    return found


GRAPH = {m: edges_of(m) for m in MODULES}


def reach(start: str) -> set[str]:
    """The modules of ``KNOWLEDGE`` reachable from ``start`` through such modules (packages'
    ``__init__`` re-exports are followed to what they name)."""
    seen, todo = {start}, [start]
    while todo:
        for target in GRAPH[todo.pop()]:
            if target.startswith(KNOWLEDGE) and target != "clusterfed.strategies" and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def lines(module: str) -> int:
    return len(MODULES[module].read_text().splitlines())


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module."""
    from scipy.sparse import lil_matrix
    from scipy.sparse.csgraph import connected_components

    names = sorted(GRAPH)
    index = {name: i for i, name in enumerate(names)}
    adjacency = lil_matrix((len(names), len(names)), dtype=bool)
    for source, targets in GRAPH.items():
        for target in targets:
            adjacency[index[source], index[target]] = True
    _, labels = connected_components(adjacency.tocsr(), directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for name, label in zip(names, labels):
        groups.setdefault(int(label), []).append(name)
    return sorted(group for group in groups.values() if len(group) > 1)


def main() -> None:
    from flwr.serverapp.strategy import Strategy

    from clusterfed.strategies import REGISTRY

    strategies = {}
    for name, path in REGISTRY.items():
        module, _, cls_name = path.partition(":")
        cls = getattr(import_module(module), cls_name)
        mro = list(cls.__mro__)
        below = mro[: mro.index(Strategy)] if Strategy in mro else mro[:-1]
        spans = sorted(reach(module))
        strategies[name] = {
            "mro_below_flower_strategy": [c.__name__ for c in below],
            "mro_depth": len(below),
            "own_module": module,
            "own_module_lines": lines(module),
            "modules_spanned": len(spans),
            "lines_spanned": sum(lines(m) for m in spans),
            "strategy_modules_spanned": sum(m.startswith("clusterfed.strategies.") for m in spans),
            "strategy_lines_spanned": sum(lines(m) for m in spans if m.startswith("clusterfed.strategies.")),
            "core_modules_spanned": sum(m.startswith("clusterfed.core.") for m in spans),
            "core_lines_spanned": sum(lines(m) for m in spans if m.startswith("clusterfed.core.")),
            "spans": spans,
        }
    to_runner = sorted(f"{m} -> {t}" for m in GRAPH if m.startswith("clusterfed.strategies")
                       for t in GRAPH[m] if t.startswith("clusterfed.runner"))
    protocols, getattrs = [], []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id == "Protocol") or
                    (isinstance(b, ast.Attribute) and b.attr == "Protocol") or
                    (isinstance(b, ast.Subscript) and getattr(b.value, "id", None) == "Protocol") for b in node.bases):
                protocols.append(f"{module}.{node.name}")
        getattrs += [module for node in ast.parse(path.read_text()).body
                     if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
                     or isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__getattr__" for t in node.targets)]
    print(json.dumps({"strategies": strategies, "import_cycles": cycles(), "strategies_to_runner": to_runner,
                      "typing_protocols": protocols, "module_getattr": getattrs}, indent=1))


if __name__ == "__main__":
    main()
