"""FedProx: FedAvg with the client-side proximal term mu/2·||w − w_global||²."""

from typing import Any

from clusterfed.strategies.base import Algorithm


class FedProx(Algorithm):
    name = "fedprox"
    reads = ("proximal-mu",)

    def train_instructions(self, server_round: int, key: str) -> dict[str, Any]:
        return {"proximal-mu": self.config.proximal_mu}
