"""The one way clusterfed loads code on first use: an import path as a string, resolved by
``load`` when it is first needed, so that ``import clusterfed`` stays light and
``strategies/`` reaches ``runner/`` without importing it.

An import path is ``"package.module:attribute"`` (or ``"package.module"``: the module). The
tables of such paths:

- ``clusterfed.PUBLIC_SUPPORT`` and the registry's strategies: ``clusterfed``'s public names;
- ``clusterfed.strategies.AUTHOR_KIT``: what a strategy module is written with;
- ``clusterfed.strategies.REGISTRY``: run-config name -> the class that implements it (and
  entry points or a run config's ``"package.module:Class"`` for strategies from outside);
- ``clusterfed.strategy_protocol.RUNNER``: the runner behind a strategy's Flower methods.

A package exposes a table's names as attributes with ``attributes`` (its module
``__getattr__``). This module imports nothing of clusterfed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


class MissingName(AttributeError):
    """The module of an import path was imported but has no such attribute."""


def load(path: str) -> Any:
    """What ``"package.module:attribute"`` names (the module itself for ``"package.module"``),
    importing the module if it is not yet. An ImportError of the module propagates; a module
    without the attribute raises ``MissingName``."""
    module_name, _, attribute = path.partition(":")
    module = import_module(module_name)
    if not attribute:
        return module
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise MissingName(f"module {module_name!r} has no {attribute!r}") from None


def attributes(owner: str, table: Mapping[str, str] | Callable[[], Mapping[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for package ``owner``: a name of ``table`` (name -> import path,
    or a function giving it, read at each access so that a registry line added later counts)
    is loaded on first access; ``__all__``, when the package does not define it, is the
    table's names."""

    def __getattr__(name: str) -> Any:
        paths = table() if callable(table) else table
        if name in paths:
            return load(paths[name])
        if name == "__all__":
            return list(paths)
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")

    return __getattr__
