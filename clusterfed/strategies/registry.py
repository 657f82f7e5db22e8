"""The strategy registry: run-config name -> the class that implements it, as import paths
resolved when a run starts by ``clusterfed.lazy.load`` (a strategy's module, and what it
imports, is loaded only when it is used), plus the strategies installed packages declare as
entry points. Every entry but ``flwr-fedavg`` is a ``ClusteredStrategy``; ``flwr-fedavg`` is Flower's own FedAvg, unchanged,
kept as the reference our measurements are checked against. Re-exported by
``clusterfed.strategies``; imports no strategy code, so the base's parameter errors can name the
strategies that have a parameter without a cycle."""

from __future__ import annotations

from importlib.metadata import entry_points

from clusterfed import lazy

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
CLUSTERED_BASE = "clusterfed.strategies.base.ClusteredStrategy"
PACKAGE = "clusterfed.strategies"  # a registered class defined in this package is a public name of clusterfed


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
        return lazy.load(path)
    except ImportError as error:
        raise UnknownStrategyError(f"{origin} {path!r}: module {module_name!r} cannot be imported ({error})") from None
    except lazy.MissingName:
        raise UnknownStrategyError(f"{origin} {path!r}: module {module_name!r} has no {attribute!r}") from None


def is_clustered(cls: object) -> bool:
    """Whether ``cls`` is a ``ClusteredStrategy`` subclass, read from its MRO by name: the
    registry (which ``import clusterfed`` loads) imports no strategy code, and the base
    imports the registry (its error hints name the strategies that have a parameter)."""
    return isinstance(cls, type) and any(f"{c.__module__}.{c.__qualname__}" == CLUSTERED_BASE for c in cls.__mro__)


def strategy_class(name: str) -> type:
    """The class of a registered name, an entry point's name, or a ``module:Class`` path."""
    if name in REGISTRY:
        return _load(REGISTRY[name], "strategy")
    if ":" in name:
        cls = _load(name, "strategy")
    elif name in (eps := _entry_points()):
        cls = _load(eps[name], f"entry point {name!r} =")
    else:
        raise UnknownStrategyError(f"unknown strategy {name!r}; available: {', '.join(strategy_names())}, "
                                   f"or 'package.module:Class' of a ClusteredStrategy subclass")
    if not is_clustered(cls):
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
    out = {}
    for name in REGISTRY:
        cls = strategy_class(name)
        if is_clustered(cls):
            out[name] = cls
    return out
