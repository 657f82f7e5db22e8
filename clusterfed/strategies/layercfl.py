"""LayerCFL (layer-wise clustered federated learning; the paper's Algorithm 2).

Sattler's CFL procedure (``cfl.py``: same criteria, timing and complete-linkage
bi-partition) with two changes:

1. the cosine similarity is computed on the updates of the selected layers only:
   ``skew = feature`` → ``conv`` (last conv layer), ``label`` → ``fc`` (first fully
   connected layer), ``unknown`` → all layers; an explicit ``cluster-layers`` (a rule or
   layer names) overrides the skew;
2. a proposed split is kept only if it passes the correct-clustering check (Theorem 1,
   eq. 20: ``sqrt((1 − α_cross_max)/2) > γ_max``) with γ estimated from each client's
   nearest peer on its own side (``clustering/layercfl.estimate_gammas``: the side-mean
   estimator would veto every correct top-level split of a 4-group hierarchy). A refused
   split leaves the cluster whole and is logged in ``refused_splits``; it is proposed
   again in a later round while the criteria hold. CFL's silhouette acceptance test
   (``split-min-silhouette``, on the selected layers' updates) is inherited and applied
   first: a proposal it refuses never reaches the check (reason ``silhouette``).

The split criteria (stationarity / heterogeneity) stay on the full updates, as in
Algorithm 1/2 of the paper: they describe the cluster's training state, not its structure.

Uplink: the protocol aggregates full updates every round, so every member uploads its
whole update anyway and the split decision reads the selected layers out of that same
upload — LayerCFL saves no uplink here. It would only save uplink in a protocol with
rounds that do not aggregate. (Newcomers placed after a split do upload only the
selected layers: see ``BiPartitioning.admit``.)
"""

from __future__ import annotations

import numpy as np

from clusterfed.clustering.layercfl import CheckResult, correct_clustering_check
from clusterfed.models.layers import select_layers
from clusterfed.strategies.cfl import CFL

LAYER_RULE_OF_SKEW = {"feature": "conv", "label": "fc", "unknown": "all"}


class LayerCFL(CFL):
    name = "layercfl"
    reads = CFL.reads + ("skew", "cluster-layers", "correct-clustering-check")

    def init_clusters(self) -> None:
        super().init_clusters()
        rule = self.config.cluster_layers
        if rule == "auto":
            rule = LAYER_RULE_OF_SKEW[self.config.skew]
        self.layer_rule = rule
        self.selected_names = select_layers(self.theta0, rule)

    def decision_names(self) -> list[str]:
        return self.selected_names

    def check_split(self, U: np.ndarray, side_a: np.ndarray, side_b: np.ndarray, S: np.ndarray) -> CheckResult:
        return correct_clustering_check(U, side_a, side_b, similarity=S)

    def cluster_state(self) -> dict:
        state = super().cluster_state()
        state["layers"] = {"rule": self.layer_rule, "names": self.selected_names}
        return state
