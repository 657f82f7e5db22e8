"""clusterfed: clustered federated learning as Flower strategies.

Construct one in your own ServerApp where ``FedAvg(...)`` stood::

    from clusterfed import FedClust
    result = FedClust(fraction_train=1.0).start(grid=grid, initial_arrays=arrays, num_rounds=20)

The strategies are imported on first use, so ``import clusterfed`` stays light. Every
strategy registered in ``clusterfed.strategies.REGISTRY`` from that package is a public name
under its class name (``FedClust``, ``CFL``, …), read from the registry: adding one adds
no line here. ``clusterfed.__version__`` is the installed package's version. ``dir(clusterfed)`` lists every public name; type checkers read the
generated stub ``__init__.pyi`` (``python -m clusterfed.reference --write``).
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

from clusterfed import strategy_protocol
from clusterfed.strategies import public_strategies

try:
    __version__ = version("clusterfed")  # the installed distribution's, from pyproject.toml
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"



def _load_runner() -> strategy_protocol.StrategyRunner:
    """The runner behind every strategy's ``start`` and single-phase hooks. The package root is
    the one module that knows both ``strategies/`` and ``runner/``, so it wires them: a strategy
    reaches the runner through ``strategy_protocol.runner()`` without importing it, and it is
    loaded on a strategy's first ``start`` (it loads scikit-learn, through the run recorder)."""
    from clusterfed.runner import strategy_runner

    return strategy_runner


strategy_protocol.install_runner(_load_runner)

# the public names that are not strategies: name -> the module that defines it
_SUPPORT = {
    "ClusteredStrategy": "clusterfed.strategies.base",
    "ClusteredResult": "clusterfed.strategies.base",
    "StrategyParams": "clusterfed.strategies.base",
    "ClusteredState": "clusterfed.strategies.base",
    "StrategyParamsError": "clusterfed.strategies.base",
    "CapabilityError": "clusterfed.strategies.base",
    "ClientFailureError": "clusterfed.strategies.base",
    "ModelMismatchError": "clusterfed.strategies.base",
    "Ask": "clusterfed.strategies.exchange",
    "TrainReply": "clusterfed.strategies.exchange",
    "ClientInfo": "clusterfed.strategies.exchange",
    "inprocess_grid": "clusterfed.simulation",
    "compared_names": "clusterfed.models.parameters",
    "trainable_names": "clusterfed.models.parameters",
    "select_layers": "clusterfed.models.layers",
}


def _public() -> dict[str, str]:
    """Every public name -> its module: the registered strategies, then ``_SUPPORT``."""
    return {**public_strategies(), **_SUPPORT}


def __getattr__(name: str):
    public = _public()
    if name == "__all__":  # from the registry as it is now
        return list(public)
    if name in public:
        return getattr(import_module(public[name]), name)
    raise AttributeError(f"module 'clusterfed' has no attribute {name!r}")


def __dir__() -> list[str]:
    own = set(globals()) - {"import_module", "annotations", "public_strategies", "_SUPPORT", "_public", "version",
                            "PackageNotFoundError", "strategy_protocol", "_load_runner"}
    return sorted(own | set(_public()) | {"__all__"})
