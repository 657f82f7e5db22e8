"""Strategy registry: run-config name -> the class that implements it, and the kit a
strategy is written with.

Entries are import paths, resolved when a run starts, so a strategy's module (and what
it imports) is loaded only when it is used. Every entry but ``flwr-fedavg`` is a
``ClusteredStrategy``; ``flwr-fedavg`` is Flower's own FedAvg, unchanged, kept as the
reference our measurements are checked against.

Adding a strategy to clusterfed is its module in this package, its test and one line in
``REGISTRY``: the public name (``clusterfed.<Class>``, ``__all__``, ``dir(clusterfed)``), the
type stub, the configuration reference (``python -m clusterfed.reference --write``) and the
partial-participation smoke run all follow from that line and the class.

A strategy defined outside clusterfed runs by ``strategy = "package.module:Class"`` in a
run config, or by name once its package declares an entry point in the
``clusterfed.strategies`` group (``[project.entry-points."clusterfed.strategies"]
mystrategy = "package.module:Class"``). Either must subclass ``ClusteredStrategy``.

What a strategy module needs is importable from here (``from clusterfed.strategies import
ClusteredStrategy, Steps, steps, select_layers, upload_names``), loaded on first use; see
``AUTHOR_KIT`` and docs/library.md, "Writing a strategy".
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

REGISTRY = {
    "fedavg": "clusterfed.strategies.fedavg:FedAvg",
    "flwr-fedavg": "clusterfed.runner.flwr_fedavg:FlowerFedAvg",
    "fedprox": "clusterfed.strategies.fedprox:FedProx",
    "local": "clusterfed.strategies.local:Local",
    "oracle": "clusterfed.strategies.oracle:Oracle",
    "fedclust": "clusterfed.strategies.fedclust:FedClust",
    "adacfl": "clusterfed.strategies.adacfl:AdaCFL",
    "cfl": "clusterfed.strategies.cfl:CFL",
    "layercfl": "clusterfed.strategies.layercfl:LayerCFL",
    "hicfl": "clusterfed.strategies.hicfl:HiCFL",
    "ifca": "clusterfed.strategies.ifca:IFCA",
    "selection": "clusterfed.strategies.selection:ClientSelection",
}
ENTRY_POINT_GROUP = "clusterfed.strategies"
PACKAGE = __name__  # a registered class defined in this package is a public name of clusterfed

# what a strategy module is written with: name -> the module that defines it
AUTHOR_KIT = {
    # the base and its declarations
    "ClusteredStrategy": "clusterfed.strategies.base",
    "StrategyParams": "clusterfed.strategies.base",
    "ClusteredState": "clusterfed.strategies.base",
    "StrategyParamsError": "clusterfed.strategies.base",
    "MULTI_MODEL": "clusterfed.strategies.base",
    "LABEL_STATS": "clusterfed.strategies.base",
    # hooks that ask clients for work
    "Steps": "clusterfed.strategies.base",
    "steps": "clusterfed.strategies.base",
    "Ask": "clusterfed.strategies.exchange",
    "Replies": "clusterfed.strategies.exchange",
    "TrainReply": "clusterfed.strategies.exchange",
    "ClientInfo": "clusterfed.strategies.exchange",
    "Arrays": "clusterfed.strategies.exchange",
    "weighted_average": "clusterfed.strategies.exchange",
    "natural": "clusterfed.strategies.exchange",
    # partial upload: which arrays, asked how, stacked how
    "select_layers": "clusterfed.models.layers",
    "LAYER_RULES": "clusterfed.models.layers",
    "compared_names": "clusterfed.models.parameters",
    "upload_names": "clusterfed.protocol",
    "parse_upload": "clusterfed.protocol",
    "UPLOAD_FULL": "clusterfed.protocol",
    "RETURN_WEIGHTS": "clusterfed.protocol",
    "RETURN_UPDATE": "clusterfed.protocol",
    "stack_partials": "clusterfed.clustering.distances",
}

if TYPE_CHECKING:  # what IDEs and type checkers read; at run time each is imported on first use
    from clusterfed.clustering.distances import stack_partials
    from clusterfed.models.layers import LAYER_RULES, select_layers
    from clusterfed.models.parameters import compared_names
    from clusterfed.protocol import RETURN_UPDATE, RETURN_WEIGHTS, UPLOAD_FULL, parse_upload, upload_names
    from clusterfed.strategies.base import (
        LABEL_STATS,
        MULTI_MODEL,
        ClusteredState,
        ClusteredStrategy,
        Steps,
        StrategyParams,
        StrategyParamsError,
        steps,
    )
    from clusterfed.strategies.exchange import Arrays, Ask, ClientInfo, Replies, TrainReply, natural, weighted_average


class UnknownStrategyError(ValueError):
    """The strategy name or import path cannot be resolved; the message says why."""


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def strategy_names() -> list[str]:
    """Registered names, then names from installed entry points."""
    return list(REGISTRY) + [name for name in _entry_points() if name not in REGISTRY]


def _load(path: str, origin: str) -> type:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UnknownStrategyError(f"{origin} {path!r} is not of the form 'package.module:Class'")
    try:
        module = import_module(module_name)
    except ImportError as error:
        raise UnknownStrategyError(f"{origin} {path!r}: module {module_name!r} cannot be imported ({error})") from None
    try:
        cls = getattr(module, attribute)
    except AttributeError:
        raise UnknownStrategyError(f"{origin} {path!r}: module {module_name!r} has no {attribute!r}") from None
    return cls


def strategy_class(name: str) -> type:
    """The class of a registered name, an entry point's name, or a ``module:Class`` path."""
    from clusterfed.strategies.base import ClusteredStrategy

    if name in REGISTRY:
        return _load(REGISTRY[name], "strategy")
    if ":" in name:
        cls = _load(name, "strategy")
    elif name in (eps := _entry_points()):
        cls = _load(eps[name], f"entry point {name!r} =")
    else:
        raise UnknownStrategyError(f"unknown strategy {name!r}; available: {', '.join(strategy_names())}, "
                                   f"or 'package.module:Class' of a ClusteredStrategy subclass")
    if not (isinstance(cls, type) and issubclass(cls, ClusteredStrategy)):
        raise UnknownStrategyError(f"strategy {name!r} is not a clusterfed.ClusteredStrategy subclass")
    return cls


def public_strategies() -> dict[str, str]:
    """Class name -> module of every registered strategy defined in this package, in
    registry order: the strategies ``clusterfed`` exports (read without importing them)."""
    out = {}
    for path in REGISTRY.values():
        module_name, _, attribute = path.partition(":")
        if module_name.startswith(PACKAGE + "."):
            out[attribute] = module_name
    return out


def clustered_classes() -> dict[str, type]:
    """Every registered ClusteredStrategy by name (the configuration reference's order)."""
    from clusterfed.strategies.base import ClusteredStrategy

    out = {}
    for name in REGISTRY:
        cls = strategy_class(name)
        if issubclass(cls, ClusteredStrategy):
            out[name] = cls
    return out


def __getattr__(name: str):
    if name in AUTHOR_KIT:
        return getattr(import_module(AUTHOR_KIT[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AUTHOR_KIT", "ENTRY_POINT_GROUP", "REGISTRY", "UnknownStrategyError", "clustered_classes",
           "public_strategies", "strategy_class", "strategy_names", *AUTHOR_KIT]
