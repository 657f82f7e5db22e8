"""AdaCFL (Gong et al., "Adaptive Clustered Federated Learning for Heterogeneous Data in
Edge Computing", Mobile Networks and Applications 2022): FedAvg warm-up, entropy
pre-clustering, threshold clustering on the smallest fully connected layer, per-cluster
FedAvg, newcomers with the ε rule.

Algorithm box (the paper's Alg. 1 and 2):

1. Warm-up: ``warmup-rounds`` rounds of FedAvg, every client in one cluster.
2. Clustering step, at the start of round ``warmup-rounds + 1`` (round 1 when there is no
   warm-up): every client trains the warm-up global model locally and uploads only the
   ``smallest-fc`` layer (``cluster-layers``). With ``share-label-stats`` the clients'
   profiles carry the number of classes ``L_c`` and the label entropy ``s_c``; the server
   pre-clusters on them (``entropy-gap``), otherwise every client is in one pre-cluster.
3. Inside each pre-cluster: distance matrix and threshold cut at ``lambda`` (number, or
   ``auto``); the final clusters are the union. Every cluster model starts from the
   warm-up global model.
4. Then per-cluster FedAvg. A newcomer trains the same start model, uploads the same
   layer and joins the nearest cluster reference unless that is farther than ε
   (``epsilon``; ``auto`` = the largest distance between two references); then it founds
   a new cluster.

Choices the paper leaves open (documented here, all configurable):

- **Local training of the clustering step: ``cluster-epochs`` epochs, not the paper's
  single epoch**: one epoch leaves too little signal in the layer on small clients (the
  measurement: docs/algorithms/adacfl.md). ``--set adacfl.cluster-epochs=1`` gives the
  paper's step.
- **λ = auto picks one λ for all pre-clusters**: the best-silhouette cut of all clients'
  dendrogram (``cluster_auto``), then the paper's threshold cut at that λ inside each
  pre-cluster. A silhouette per pre-cluster is undefined for one or two clients and noisy
  for a few; the paper, too, uses one λ.
- **The clustering step is its own phase** (partial upload), before that round's normal
  training: the warm-up rounds upload full models (they are FedAvg rounds), so reusing
  their uploads would save nothing and would not test the partial upload.
- **Start model of the clustering step, of newcomers and of a cluster a newcomer founds:
  the warm-up global model** (θ0 when ``warmup-rounds = 0``). A newcomer must train the
  model the references were trained from, or its distances mean nothing; a founded
  cluster starts where the others started.
- Pre-clustering uses the statistics every client reported in its profile; if any
  client did not report them, the step is skipped (``preclustering`` = false in
  rounds.jsonl and clusters.json) rather than pre-clustering only some clients. It is
  skipped too when the median client holds fewer than ``entropy-min-per-class`` examples
  per class it holds (choice, beyond the paper): a client of a few dozen examples shows a
  random subset of its classes, so the class count would split one group at random
  (``preclustering_skipped`` in rounds.jsonl says so).

Partial participation (``fraction-train`` < 1): the warm-up is FedAvg over each round's
sample, every client placed in the warm-up cluster from the start (that asks nothing).
The clustering step runs on the sample of round ``warmup-rounds + 1``: the sampled clients
that reply are clustered; every other client leaves the warm-up cluster (whose model is
gone) and is placed by the newcomer rule with ε (step 4) in the first round it is sampled,
training at once. Until then it holds no cluster and is not evaluated (``oneshot.py``).

Known behaviour: the paper's entropy gap can isolate a client whose labels are unevenly
balanced among clients that hold the same labels evenly, so on digit pairs the ARI can be
below 1 (docs/algorithms/adacfl.md); ``share-label-stats = false`` avoids it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering import cluster_within_preclusters, entropy_preclusters, linkage_matrix
from clusterfed.strategies.base import LABEL_STATS, Steps
from clusterfed.strategies.exchange import Diagnostics
from clusterfed.strategies.oneshot import OneShotClustering, OneShotParams, OneShotState, PositiveNumber

_STATS = ("num-classes", "label-entropy")


class AdaCFLParams(OneShotParams):
    warmup_rounds: int = Field(1, alias="warmup-rounds", ge=0, description="FedAvg rounds before the clustering step")
    share_label_stats: bool = Field(True, alias="share-label-stats",
                                    description="clients report label counts/entropy for the pre-clustering "
                                                "(false: no pre-clustering; a stock ClientApp then suffices)")
    entropy_gap: float = Field(0.1, alias="entropy-gap", ge=0, description="pre-cluster gap in label entropy")
    entropy_min_per_class: float = Field(
        5.0, alias="entropy-min-per-class", ge=0,
        description="pre-cluster only when the median client holds at least this many examples per class it "
                    "holds: below, its class count and entropy are sampling noise (Cochran's rule of five)")
    epsilon: PositiveNumber | Literal["auto"] = Field(
        "auto", description='newcomer distance above which it founds a new cluster; "auto" = the largest '
                            'distance between two cluster references')


@dataclass
class AdaCFLState(OneShotState):
    warmup_cluster: int | None = None


class AdaCFL(OneShotClustering):
    """AdaCFL: warm-up, entropy pre-clustering, threshold clustering on the smallest fc layer."""

    name = "adacfl"
    Params = AdaCFLParams
    State = AdaCFLState
    layer_rule = "smallest-fc"

    stock_alternative = "construct AdaCFL(share_label_stats=False), which needs no label statistics"

    def requires(self) -> set[str]:
        return {LABEL_STATS} if self.params.share_label_stats else set()

    def init_clusters(self) -> None:
        super().init_clusters()
        self.warmup_cluster = None

    def newcomer_epsilon(self) -> float | None:
        return self.params.number_or_none(self.params.epsilon)  # None: default_epsilon of the references

    def admit(self, server_round: int, keys: list[str]) -> Steps:
        if self.clustered:
            _, _, diagnostics = yield from self.place_newcomers(server_round, keys)
            return diagnostics
        if self.warmup_cluster is None:
            self.warmup_cluster = self.new_cluster(self.theta0)
        for key in keys:
            self.assignment[key] = self.warmup_cluster

    def before_train(self, server_round: int) -> Steps:
        if self.clustered or server_round <= self.params.warmup_rounds or self.warmup_cluster is None:
            return
        keys = self.reachable(self.members(self.warmup_cluster))  # partial participation: the sample
        if not keys:
            return
        start = self.models[self.warmup_cluster]
        replied, X, bytes_up, diagnostics = yield from self.collect_partials(server_round, keys, start)
        if X is None:
            return diagnostics  # nobody replied: stay in warm-up, try again next round
        # clients whose reply was lost, that were not sampled or are absent leave the warm-up
        # cluster (its model goes) and come back as newcomers
        for key in [k for k, c in self.assignment.items() if c == self.warmup_cluster]:
            del self.assignment[key]
        del self.models[self.warmup_cluster]
        pre, preclustering, skipped = self.preclusters(replied)
        lam, auto_info = self.threshold(X)
        labels, cuts = cluster_within_preclusters(
            X, pre, lam, metric=self.params.distance, linkage=self.params.linkage,
            min_silhouette=self.params.auto_min_silhouette, return_cuts=True,
        )
        info = {**self.precluster_info(replied, X, pre, cuts, preclustering), "lambda": float(lam), **auto_info}
        diagnostics.update({**skipped, **self.form_clusters(server_round, replied, X, labels, start, bytes_up, info)})
        return {**diagnostics, "preclustering": preclustering, "num_preclusters": len(cuts)}

    def threshold(self, X: np.ndarray) -> tuple[float, dict[str, Any]]:
        """λ for every pre-cluster. ``auto``: the best-silhouette cut of all clients'
        dendrogram gives one λ, used inside each pre-cluster as the paper uses its one λ."""
        lam = self.params.number_or_none(self.params.lambda_)
        if lam is not None:
            return lam, {}
        _, info = self.cut(X)
        return info["lambda"], {"auto_best_silhouette": info["auto_best_silhouette"]}

    def preclusters(self, keys: list[str]) -> tuple[np.ndarray, bool, Diagnostics]:
        """Entropy pre-cluster per client, whether pre-clustering ran at all, and the
        diagnostics (why it was skipped)."""
        stats = [self.clients[key].label_stats for key in keys]
        if not self.params.share_label_stats or any(any(s not in st for s in _STATS) for st in stats):
            return np.zeros(len(keys), dtype=np.int64), False, {}
        per_class = float(np.median([self.clients[key].num_examples / max(int(st["num-classes"]), 1)
                                     for key, st in zip(keys, stats)]))
        if per_class < self.params.entropy_min_per_class:
            # a 16-example client of 10 balanced classes shows 7–10 of them: pre-clusters by
            # class count would be sampling noise, so every client goes to the weight clustering
            skipped = (f"median {per_class:.1f} examples per class held < entropy-min-per-class "
                       f"{self.params.entropy_min_per_class}")
            return np.zeros(len(keys), dtype=np.int64), False, {"preclustering_skipped": skipped}
        pre = entropy_preclusters([int(st["num-classes"]) for st in stats], [st["label-entropy"] for st in stats],
                                  gap=self.params.entropy_gap)
        return pre, True, {}

    def precluster_info(self, keys: list[str], X: np.ndarray, pre: np.ndarray, cuts: dict, preclustering: bool) -> dict[str, Any]:
        """The pre-clusters and, for the dendrograms, each pre-cluster's own linkage."""
        per_pre = []
        for pid in sorted(cuts):
            rows = np.flatnonzero(pre == pid)
            per_pre.append({
                "precluster": int(pid),
                "clients": [keys[i] for i in rows],
                "lambda": float(cuts[pid].threshold),
                "silhouette": cuts[pid].silhouette,
                "linkage": linkage_matrix(X[rows], metric=self.params.distance, linkage=self.params.linkage).tolist()
                if len(rows) > 1 else None,
            })
        return {
            "preclustering": preclustering,
            "preclusters": [int(p) for p in pre],
            "precluster_cuts": per_pre,
        }
