"""One lazy-loading mechanism: every name clusterfed loads on first use is an import path
("package.module:attr") in a table, resolved by ``clusterfed.lazy.load``: the package root's
public names, the strategies' author kit, the registry and the runner a strategy reaches."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import clusterfed
import clusterfed.strategies as strategies
from clusterfed import lazy, strategy_protocol
from clusterfed.strategies import registry

PACKAGE = Path(clusterfed.__file__).parent
# import_module outside clusterfed.lazy: code named by a user or a checkpoint, each with its own
# rules (not a name clusterfed loads lazily)
OTHER_LOADERS = {"client/task.py": "a user's ClientTask by path, type-checked",
                 "runner/state_decoder.py": "a checkpoint's class, refused unless defined in clusterfed"}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def test_no_module_defines_its_own_getattr():
    """A package exposing lazy names assigns ``lazy.attributes(...)`` as its ``__getattr__``."""
    defined = [name for name, tree in modules() for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    assert defined == []
    assigned = sorted(name for name, tree in modules() for node in tree.body
                      if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__getattr__" for t in node.targets))
    assert assigned == ["__init__.py", "strategies/__init__.py"]


def test_only_the_lazy_module_imports_by_name():
    users = {name for name, tree in modules() for node in ast.walk(tree)
             if isinstance(node, (ast.Import, ast.ImportFrom))
             and ((isinstance(node, ast.ImportFrom) and node.module == "importlib"
                   and any(a.name == "import_module" for a in node.names))
                  or (isinstance(node, ast.Import) and any(a.name == "importlib" for a in node.names)))}
    assert users == {"lazy.py", *OTHER_LOADERS}
    assert not [name for name, tree in modules() for node in ast.walk(tree)
                if isinstance(node, ast.Name) and node.id == "install_runner"]


def test_the_runner_is_reached_through_the_one_loader(monkeypatch):
    asked = []
    real = lazy.load
    monkeypatch.setattr(lazy, "load", lambda path: asked.append(path) or real(path))
    from clusterfed.runner import strategy_runner

    assert strategy_protocol.runner() is strategy_runner
    assert asked == [strategy_protocol.RUNNER]


def test_public_names_author_kit_and_registry_resolve_through_it(monkeypatch):
    asked = []
    real = lazy.load
    monkeypatch.setattr(lazy, "load", lambda path: asked.append(path) or real(path))
    from clusterfed.strategies.base import ClusteredStrategy
    from clusterfed.strategies.fedclust import FedClust

    assert clusterfed.FedClust is FedClust and clusterfed.ClusteredStrategy is ClusteredStrategy
    assert strategies.ClusteredStrategy is ClusteredStrategy
    assert registry.strategy_class("fedclust") is FedClust
    assert asked == ["clusterfed.strategies.fedclust:FedClust", "clusterfed.strategies.base:ClusteredStrategy",
                     "clusterfed.strategies.base:ClusteredStrategy", "clusterfed.strategies.fedclust:FedClust"]
    for table in (clusterfed.PUBLIC_SUPPORT, strategies.AUTHOR_KIT, registry.REGISTRY):
        assert all(":" in path for path in table.values())


def test_a_wrong_path_says_what_is_wrong():
    with pytest.raises(lazy.MissingName, match="'clusterfed.protocol' has no 'nothing'"):
        lazy.load("clusterfed.protocol:nothing")
    with pytest.raises(ImportError):
        lazy.load("clusterfed.no_such_module:x")
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        clusterfed.Nothing  # noqa: B018
    with pytest.raises(registry.UnknownStrategyError, match="has no 'Nothing'"):
        registry.strategy_class("clusterfed.strategies.fedclust:Nothing")


def test_import_clusterfed_loads_neither_a_strategy_nor_the_runner():
    code = ("import sys, clusterfed; print(sorted(m for m in sys.modules if m.startswith('clusterfed.') "
            "and (m.startswith('clusterfed.runner') or m == 'clusterfed.strategy_protocol' "
            "or m.startswith('clusterfed.strategies.') and m != 'clusterfed.strategies.registry')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
