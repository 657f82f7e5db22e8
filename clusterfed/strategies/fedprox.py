"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020):
FedAvg with the client-side proximal term μ/2·||w − w_global||². The server sends
``proximal-mu`` in every train message; a stock client that ignores it trains FedAvg.

Partial participation (``fraction-train`` < 1): as FedAvg — a random sample trains each
round (the paper's setting: a subset of devices per round)."""

from typing import Any

from pydantic import Field

from clusterfed.strategies.base import ClusteredStrategy, Round, StrategyParams


class FedProxParams(StrategyParams):
    proximal_mu: float = Field(0.01, alias="proximal-mu", ge=0,
                               description="μ of the proximal term the clients add to their loss")


class FedProx(ClusteredStrategy):
    """FedAvg + the proximal term ``proximal-mu`` (sent to the clients)."""

    name = "fedprox"
    Params = FedProxParams
    PAPER = {}  # the defaults are the paper's algorithm (μ is tuned per task there: proximal_mu)

    def train_instructions(self, rnd: Round, key: str) -> dict[str, Any]:
        return {"proximal-mu": self.params.proximal_mu}
