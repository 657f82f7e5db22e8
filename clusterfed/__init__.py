"""clusterfed: clustered federated learning as Flower strategies.

Construct one in your own ServerApp where ``FedAvg(...)`` stood::

    from clusterfed import FedClust
    result = FedClust(fraction_train=1.0).start(grid=grid, initial_arrays=arrays, num_rounds=20)

The strategies are imported on first use, so ``import clusterfed`` stays light.
"""

from importlib import import_module

_PUBLIC = {
    "FedAvg": "clusterfed.strategies.fedavg",
    "FedProx": "clusterfed.strategies.fedprox",
    "Local": "clusterfed.strategies.local",
    "Oracle": "clusterfed.strategies.oracle",
    "FedClust": "clusterfed.strategies.fedclust",
    "AdaCFL": "clusterfed.strategies.adacfl",
    "CFL": "clusterfed.strategies.cfl",
    "LayerCFL": "clusterfed.strategies.layercfl",
    "HiCFL": "clusterfed.strategies.hicfl",
    "IFCA": "clusterfed.strategies.ifca",
    "ClientSelection": "clusterfed.strategies.selection",
    "ClusteredStrategy": "clusterfed.strategies.base",
    "ClusteredResult": "clusterfed.strategies.base",
    "StrategyParams": "clusterfed.strategies.base",
    "ClusteredState": "clusterfed.strategies.base",
    "Ask": "clusterfed.strategies.exchange",
    "TrainReply": "clusterfed.strategies.exchange",
    "ClientInfo": "clusterfed.strategies.exchange",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'clusterfed' has no attribute {name!r}")
