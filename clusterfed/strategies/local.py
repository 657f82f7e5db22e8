"""Local: no aggregation; every client trains and is evaluated on its own model.

Each client is its own cluster, so the base's per-cluster averaging over one member
leaves the client's model as it trained it.

Partial participation (``fraction-train`` < 1): every client has its own model from the
start; it changes only in the rounds its client is sampled.
"""

from clusterfed.strategies import base
from clusterfed.strategies.base import ClusteredStrategy, Round


class Local(ClusteredStrategy):
    """Each client its own model: the lower bound without collaboration."""
    secure_refusal = base.EACH_CLIENT_ALONE  # secure aggregation refused before any message

    name = "local"

    def init_clusters(self) -> None:
        """No shared model: clusters are made per client as they arrive."""

    def admit(self, rnd: Round, keys: list[str]) -> None:
        for key in keys:
            self.state.assignment[key] = self.new_cluster(self.state.theta0)
