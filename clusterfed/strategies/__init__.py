"""Strategy registry: run-config name -> the class that implements it.

Entries are import paths, resolved when a run starts, so a strategy's module (and what
it imports) is loaded only when it is used. Every entry but ``flwr-fedavg`` is a
``ClusteredStrategy``; ``flwr-fedavg`` is Flower's own FedAvg, unchanged, kept as the
reference our measurements are checked against.

A strategy defined outside clusterfed runs by ``strategy = "package.module:Class"`` in a
run config, or by name once its package declares an entry point in the
``clusterfed.strategies`` group (``[project.entry-points."clusterfed.strategies"]
mystrategy = "package.module:Class"``). Either must subclass ``ClusteredStrategy``.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points

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


def clustered_classes() -> dict[str, type]:
    """Every registered ClusteredStrategy by name (the configuration reference's order)."""
    from clusterfed.strategies.base import ClusteredStrategy

    out = {}
    for name in REGISTRY:
        cls = strategy_class(name)
        if issubclass(cls, ClusteredStrategy):
            out[name] = cls
    return out


__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "UnknownStrategyError", "clustered_classes", "strategy_class",
           "strategy_names"]
