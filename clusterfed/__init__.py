"""clusterfed: clustered federated learning as Flower strategies.

Construct one in your own ServerApp where ``FedAvg(...)`` stood::

    from clusterfed import FedClust
    result = FedClust(fraction_train=1.0).start(grid=grid, initial_arrays=arrays, num_rounds=20)

The strategies are imported on first use, so ``import clusterfed`` stays light;
``dir(clusterfed)`` and type checkers see every public name.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

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
}

__all__ = list(_PUBLIC)

if TYPE_CHECKING:  # what IDEs and type checkers read; at run time each is imported on first use
    from clusterfed.models.parameters import compared_names, trainable_names
    from clusterfed.simulation import inprocess_grid
    from clusterfed.strategies.adacfl import AdaCFL
    from clusterfed.strategies.base import (
        CapabilityError,
        ClientFailureError,
        ClusteredResult,
        ClusteredState,
        ClusteredStrategy,
        ModelMismatchError,
        StrategyParams,
        StrategyParamsError,
    )
    from clusterfed.strategies.cfl import CFL
    from clusterfed.strategies.exchange import Ask, ClientInfo, TrainReply
    from clusterfed.strategies.fedavg import FedAvg
    from clusterfed.strategies.fedclust import FedClust
    from clusterfed.strategies.fedprox import FedProx
    from clusterfed.strategies.hicfl import HiCFL
    from clusterfed.strategies.ifca import IFCA
    from clusterfed.strategies.layercfl import LayerCFL
    from clusterfed.strategies.local import Local
    from clusterfed.strategies.oracle import Oracle
    from clusterfed.strategies.selection import ClientSelection


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'clusterfed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) - {"import_module", "annotations", "TYPE_CHECKING", "_PUBLIC"} | set(__all__))
