"""Strategy registry: run-config name -> the class that implements it.

Entries are import paths, resolved when a run starts, so a strategy's module (and what
it imports) is loaded only when it is used. Every entry but ``flwr-fedavg`` is a
transport-free ``Algorithm`` that the runner drives; ``flwr-fedavg`` is Flower's own
FedAvg strategy, unchanged, kept as the reference our measurements are checked against.
"""

from importlib import import_module

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
    "selection": "clusterfed.strategies.selection:Selection",
}

# driven by Flower's own loop, not by the runner
FLOWER_STRATEGIES = ("flwr-fedavg",)


def strategy_class(name: str) -> type:
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; available: {', '.join(REGISTRY)}")
    module, attribute = REGISTRY[name].split(":")
    return getattr(import_module(module), attribute)


__all__ = ["FLOWER_STRATEGIES", "REGISTRY", "strategy_class"]
