"""Strategy registry: run-config name -> class. Every class takes (RunConfig, RunRecorder).

Entries are import paths, resolved when a run starts, so a strategy's module is only
imported when it is used.
"""

from importlib import import_module

from clusterfed.strategies.base import ClusteredStrategy

REGISTRY = {
    "fedavg": "clusterfed.strategies.fedavg:FedAvg",
    "flwr-fedavg": "clusterfed.strategies.flwr_fedavg:FlowerFedAvg",
    "fedprox": "clusterfed.strategies.fedprox:FedProx",
    "local": "clusterfed.strategies.local:Local",
    "oracle": "clusterfed.strategies.oracle:Oracle",
    "fedclust": "clusterfed.strategies.fedclust:FedClust",
    "adacfl": "clusterfed.strategies.adacfl:AdaCFL",
    "cfl": "clusterfed.strategies.cfl:CFL",
    "layercfl": "clusterfed.strategies.layercfl:LayerCFL",
    "hicfl": "clusterfed.strategies.hicfl:HiCFL",
}


def strategy_class(name: str) -> type:
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; available: {', '.join(REGISTRY)}")
    module, attribute = REGISTRY[name].split(":")
    return getattr(import_module(module), attribute)


def build_strategy(config, recorder=None):
    return strategy_class(config.strategy)(config, recorder)


__all__ = ["REGISTRY", "ClusteredStrategy", "build_strategy", "strategy_class"]
