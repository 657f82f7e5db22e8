"""FedAvg: one global model, the K = 1 case of the clustered base."""

from clusterfed.strategies.base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
