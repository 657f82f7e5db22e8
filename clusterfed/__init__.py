"""clusterfed: clustered federated learning as Flower strategies.

Construct one in your own ServerApp where ``FedAvg(...)`` stood::

    from clusterfed import FedClust
    result = FedClust(fraction_train=1.0).start(grid=grid, initial_arrays=arrays, num_rounds=20)

The strategies are imported on first use (``clusterfed.lazy``), so ``import clusterfed`` stays
light. Every strategy registered in ``clusterfed.strategies.REGISTRY`` from that package is a
public name under its class name (``FedClust``, ``CFL``, …), read from the registry: adding one
adds no line here. ``clusterfed.__version__`` is the installed package's version.
``dir(clusterfed)`` lists every public name; type checkers read the generated stub
``__init__.pyi`` (``python -m clusterfed.reference --write``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from clusterfed import lazy
from clusterfed.strategies import public_strategies

try:
    __version__ = version("clusterfed")  # the installed distribution's, from pyproject.toml
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

# the public names that are not strategies: name -> its import path (``clusterfed.lazy``)
PUBLIC_SUPPORT = {
    "ClusteredStrategy": "clusterfed.strategies.base:ClusteredStrategy",
    "ClusteredResult": "clusterfed.strategies.base:ClusteredResult",
    "StrategyParams": "clusterfed.strategies.base:StrategyParams",
    "ClusteredState": "clusterfed.strategies.base:ClusteredState",
    "StrategyParamsError": "clusterfed.strategies.base:StrategyParamsError",
    "CapabilityError": "clusterfed.strategies.base:CapabilityError",
    "ClientFailureError": "clusterfed.strategies.base:ClientFailureError",
    "ModelMismatchError": "clusterfed.strategies.base:ModelMismatchError",
    "Ask": "clusterfed.core.exchange:Ask",
    "TrainReply": "clusterfed.core.exchange:TrainReply",
    "ClientInfo": "clusterfed.core.exchange:ClientInfo",
    "inprocess_grid": "clusterfed.simulation:inprocess_grid",
    "compared_names": "clusterfed.models.parameters:compared_names",
    "trainable_names": "clusterfed.models.parameters:trainable_names",
    "select_layers": "clusterfed.models.layers:select_layers",
}


def _paths() -> dict[str, str]:
    """Every public name -> its import path: the registered strategies, then ``PUBLIC_SUPPORT``."""
    return {**{name: f"{module}:{name}" for name, module in public_strategies().items()}, **PUBLIC_SUPPORT}


def _public() -> dict[str, str]:
    """Every public name -> the module that defines it (what the generated stub imports)."""
    return {name: path.partition(":")[0] for name, path in _paths().items()}


__getattr__ = lazy.attributes(__name__, _paths)  # ``__all__`` too: from the registry as it is now


def __dir__() -> list[str]:
    own = set(globals()) - {"annotations", "lazy", "public_strategies", "PUBLIC_SUPPORT", "_paths", "_public",
                            "version", "PackageNotFoundError"}
    return sorted(own | set(_paths()) | {"__all__"})
