"""FedClust (Islam et al., "FedClust: Tackling Data Heterogeneity in Federated Learning
through Weight-Driven Client Clustering", ICPP 2024): one-shot clustering on the final
layer's weights, then per-cluster FedAvg.

1. Clustering round (the first round, all available clients): each client trains ``θ0`` for
   ``cluster-epochs`` epochs and uploads only the ``final`` layer (``cluster-layers``).
   The server builds the distance matrix on these partial weights (``distance``; cosine
   by default, the paper's L2 selectable), cuts the dendrogram at ``lambda`` (a number,
   or ``auto``: the best-silhouette cut, kept when its silhouette reaches
   ``auto-min-silhouette`` or beats what group-free data of the same size reaches,
   ``clustering/null_reference.py``) and starts every cluster model at ``θ0``.
2. Every round: a ``fraction-train`` sample trains its cluster's model; FedAvg per cluster.
3. Newcomers (a client key with no assignment, any later round) train ``θ0`` the same way,
   upload the same layer and join the nearest cluster reference; FedClust never founds a
   new cluster (ε = inf).

Partial participation (``fraction-train`` < 1): the clustering round is the first
round's sample (the clients of the sample that reply are clustered); a client first
sampled later is placed as a newcomer (step 3) in that round and trains at once. Until
then it holds no cluster and is not evaluated (``oneshot.py``).

The shared machinery (partial-weight phase, cut, references, newcomers) is in ``oneshot.py``.
"""

from __future__ import annotations

import time

from pydantic import Field

from clusterfed.strategies.base import Steps
from clusterfed.strategies.oneshot import OneShotClustering, OneShotParams


class FedClustParams(OneShotParams):
    cluster_sample: int = Field(0, alias="cluster-sample", ge=0,
                                description="cluster this many sampled clients with the full method and place the "
                                            "rest at the nearest cluster reference (0 = cluster all)")


class FedClust(OneShotClustering):
    """FedClust: one-shot clustering on the final layer's weights."""

    name = "fedclust"
    Params = FedClustParams
    layer_rule = "final"

    def admit(self, server_round: int, keys: list[str]) -> Steps:
        if self.clustered:
            yield from self.place_newcomers(server_round, keys)
            return
        keys = self.reachable(keys)  # partial participation: the round's sample is clustered
        if not keys:
            return
        replied, X, bytes_up = yield from self.collect_partials(server_round, keys, self.theta0)
        if X is None:
            return  # nobody replied: try again next round
        started = time.perf_counter()
        labels, info = self.cut(X)
        self.clustering_seconds += time.perf_counter() - started
        self.form_clusters(server_round, replied, X, labels, self.theta0, bytes_up, info)
