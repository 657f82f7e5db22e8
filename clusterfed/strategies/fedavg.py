"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017): one global model, the K = 1 case of the clustered base.
A stock Flower ClientApp is enough.

Partial participation (``fraction-train`` < 1): as Flower's FedAvg — each round a random
``fraction-train`` sample of the clients (at least ``min-train-nodes``) trains and the
model is their sample-weighted average; every client is evaluated on the one model."""

from clusterfed.strategies.base import ClusteredStrategy


class FedAvg(ClusteredStrategy):
    """FedAvg on the clustered base: sample-weighted averaging of the clients' weights."""

    name = "fedavg"
    PAPER = {}  # the defaults are the paper's algorithm (fraction-train is its C)
