"""FedClust (Islam et al., "FedClust: Tackling Data Heterogeneity in Federated Learning
through Weight-Driven Client Clustering", ICPP 2024): one-shot clustering on the final
layer's weights, then per-cluster FedAvg.

1. Clustering round (the first round, all available clients): each client trains ``θ0`` for
   ``cluster-epochs`` epochs and uploads only the compared layer (``cluster-layers``: the
   paper's ``final``, or by default the layer chosen by evidence, ``layer_choice.py``); a
   stock ClientApp, which trains its own ``local-epochs``, is sent its reply back until it
   has trained as long (``partial_weights.py``).
   The server builds the distance matrix on these partial weights (``distance``; cosine
   by default, the paper's L2 selectable), cuts the dendrogram at ``lambda`` (a number,
   or ``auto``: the best-silhouette cut, kept when its silhouette reaches
   ``auto-min-silhouette`` or beats what group-free data of the same size and shape reaches:
   the rows rotated about their mean, ``clustering/null_reference.py``) and starts every
   cluster model at ``θ0``.
2. Every round: a ``fraction-train`` sample trains its cluster's model; FedAvg per cluster.
3. Newcomers (a client key with no assignment, any later round) train ``θ0`` the same way,
   upload the same layer and join the nearest cluster reference; FedClust never founds a
   new cluster (ε = inf).

Partial participation (``fraction-train`` < 1): the clustering round is the first
round's sample (the clients of the sample that reply are clustered); a client first
sampled later is placed as a newcomer (step 3) in that round and trains at once. Until
then it holds no cluster and is not evaluated.

A first sample too small to show the groups (``lambda = auto`` found one cluster): the
server keeps the partial weights of every client placed in that one cluster (the
clustering round's and each newcomer's, all trained from ``θ0``) and cuts them again each
time their number has doubled since the last cut. The first cut that finds clusters forms
them from the one cluster's current model, assigns every kept client and makes later
newcomers join the nearest reference; until then the clients stay one cluster and the
run's reason names the number of clients the last cut saw. With every client in the
first round (full participation, nobody joining later) there is nothing to add, and the run
is the paper's; clients joining later (``newcomer-fraction``) count as the sample growing.
``recut = false`` keeps the paper's single cut.

The machinery FedClust shares with AdaCFL is in two parts it builds: ``PartialWeights``
(the clustering phase's upload, ``partial_weights.py``) and ``OneShotClusters`` (cut,
clusters, references, newcomers, ``oneshot_clusters.py``). Every extension beyond the
paper is a parameter, listed with its default in docs/algorithms/fedclust.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import Field

from clusterfed.clustering import DEFAULT_MAX_CLUSTERS
from clusterfed.strategies.base import ClusteredStrategy, Steps
from clusterfed.strategies.exchange import Diagnostics, natural
from clusterfed.strategies.oneshot import ONE_CLUSTER_REASONS, OneShotParams, OneShotState
from clusterfed.strategies.oneshot_clusters import OneShotClusters
from clusterfed.strategies.partial_weights import PartialWeights

PAPER_LAYERS = "final"  # the paper's compared layer


def recut_max_clusters(clients: int, ceiling: int = DEFAULT_MAX_CLUSTERS) -> int:
    """The most clusters a re-cut of ``clients`` kept partial weights may form: sqrt(clients / 2),
    the rule of thumb for the number of clusters in Mardia, Kent and Bibby, "Multivariate
    Analysis" (1979), at least 2 and at most the first cut's bound (``ceiling``: ``max-clusters``).
    Why: clients holding a few images train alike when their labels are alike, so their rows
    hold tight groups of a few clients below the true groups; the group-free reference has no
    such fine structure, so an unbounded best-silhouette cut can pass it with many clusters of
    two or three clients."""
    return max(2, min(ceiling, int(math.sqrt(clients / 2))))


class FedClustParams(OneShotParams):
    cluster_sample: int = Field(0, alias="cluster-sample", ge=0,
                                description="cluster this many sampled clients with the full method and place the "
                                            "rest at the nearest cluster reference (0 = cluster all)")
    recut: bool = Field(True, description='lambda = "auto", a first cut that left one cluster: cut the placed clients\' '
                                          "partial weights again, into at most sqrt(n / 2) clusters, each time "
                                          "their number n doubles (partial participation, late joiners; false = "
                                          "the paper's single cut)")


@dataclass
class FedClustState(OneShotState):
    # a sample that showed no groups: the partial weights of every client placed in the one
    # cluster since (all trained from θ0), cut again when their number reaches ``recut_at``
    unclustered: dict[str, np.ndarray] = field(default_factory=dict)
    recut_at: int = 0
    recuts: list[dict[str, Any]] = field(default_factory=list)


class FedClust(ClusteredStrategy):
    """FedClust: one-shot clustering on the final layer's weights."""

    name = "fedclust"
    Params = FedClustParams
    State = FedClustState
    params: FedClustParams
    state: FedClustState
    one_cluster_reasons = ONE_CLUSTER_REASONS
    figures = ("distance_matrix", "linkage")

    # the parts, built on first use (the constructor stays the base's: its signature is the Params')
    @cached_property
    def partials(self) -> PartialWeights:
        return PartialWeights(self, PAPER_LAYERS, cut=self.cut)

    @cached_property
    def clusters(self) -> OneShotClusters:
        return OneShotClusters(self, self.partials)

    def init_clusters(self) -> None:
        self.clusters.start()

    @property
    def layer_keys(self) -> list[str]:
        """The arrays uploaded and compared now (``layer_choice.py``)."""
        return self.partials.keys

    def draw_sample(self, server_round: int) -> list[str] | None:
        """Placing asks clients for work: sample among all active clients first."""
        return self.sample_active()

    def admit(self, server_round: int, keys: list[str]) -> Steps:
        """Clients not placed yet: the clustering round (step 1) until it has run, then
        newcomers (step 3)."""
        if self.state.clustered:
            return (yield from self.place_newcomers(server_round, keys))
        return (yield from self.clustering_round(server_round, keys))

    # ----------------------------------------------- step 1: the clustering round
    def clustering_round(self, server_round: int, keys: list[str]) -> Steps:
        """The sampled ``keys`` train θ0 and upload the compared layer; the proximity matrix
        of their partial weights is cut (``cut``) and every cluster model starts at θ0."""
        keys = self.reachable(keys)  # partial participation: the round's sample is clustered
        if not keys:
            return
        replied, X, bytes_up, diagnostics = yield from self.partials.collect(server_round, keys, self.state.theta0)
        if X is None:
            return diagnostics  # nobody replied: try again next round
        labels, info = self.cut(X)
        diagnostics.update(self.clusters.form(server_round, replied, X, labels, self.state.theta0, bytes_up, info))
        self.clusters.say_cut(diagnostics, labels, info)
        if self.params.recut and self.params.lambda_ == "auto" and len(np.unique(labels)) == 1:
            # float32, as the clients sent them: half the memory, a cut of the same labels
            self.state.unclustered = dict(zip(replied, X.astype(np.float32)))
            self.state.recut_at = 2 * len(replied)
        return diagnostics

    def cut(self, X: np.ndarray, max_clusters: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """The hierarchical cut of the rows of X at ``lambda`` into at most ``max_clusters``
        (default ``max-clusters``; ``cluster-sample`` > 0: a cut of a sample, the rest placed
        at the nearest reference); labels and what the cut used."""
        return self.clusters.cut(X, max_clusters=max_clusters, sample=self.params.cluster_sample)

    # -------------------------------------------------------- step 3: newcomers
    def place_newcomers(self, server_round: int, keys: list[str]) -> Steps:
        """Newcomers train θ0, upload the same layer and join the nearest cluster reference
        (ε = inf: FedClust never founds a cluster); while the first cut left one cluster,
        their rows are kept for the re-cut."""
        replied, X, diagnostics = yield from self.clusters.place_newcomers(server_round, keys, epsilon=math.inf)
        if self.state.recut_at and X is not None:
            self.state.unclustered.update(zip(replied, X.astype(np.float32)))
            if len(self.state.unclustered) >= self.state.recut_at:
                diagnostics.update(self.recut(server_round))
        return diagnostics

    # ------------------------------------------------- extension: the re-cut
    def recut(self, server_round: int) -> Diagnostics:
        """Cut the kept partial weights of the one cluster's members again (a grown sample);
        on clusters, form them from the one cluster's current model. Returns the diagnostics."""
        keys = sorted(self.state.unclustered, key=natural)
        X = np.stack([self.state.unclustered[key] for key in keys], dtype=np.float64)
        bound = recut_max_clusters(len(keys), self.params.max_clusters)
        labels, info = self.cut(X, max_clusters=bound)
        clusters = len(np.unique(labels))
        self.state.recuts.append({"round": server_round, "clients": len(keys), "max_clusters": bound,
                                  "clusters": int(clusters), "best_silhouette": info.get("auto_best_silhouette"),
                                  "required_silhouette": info.get("auto_required_silhouette")})
        diagnostics = {"recut_clients": len(keys)}
        if clusters == 1:
            if len(keys) >= len(self.clients):  # every known client was cut: nothing left to grow
                self.state.unclustered, self.state.recut_at = {}, 0
            else:  # next when the sample has doubled or holds every known client
                self.state.recut_at = min(2 * len(keys), len(self.clients))
            self.state.clustering_state.update({k: v for k, v in info.items() if k != "lambda"})
            return diagnostics
        (single,) = set(self.state.models)
        current = self.state.models.pop(single)
        first_round = self.state.clustering_state["clustering_round"]
        diagnostics.update(self.clusters.form(server_round, keys, X, labels, self.state.theta0, 0, info,
                                              models_from=current))
        self.state.clustering_state["clustering_round"] = first_round
        self.state.unclustered, self.state.recut_at = {}, 0
        return diagnostics

    # ------------------------------------------------------ what the run says
    def cluster_state(self) -> dict[str, Any]:
        recuts = self.state.recuts
        return {**self.state.clustering_state, **({"recuts": list(recuts)} if recuts else {})}

    def one_cluster_reason(self) -> str | None:
        reason = self.clusters.one_cluster_reason()
        if reason and self.state.recuts:
            reason += f" (cut again on a grown sample: last on {self.state.recuts[-1]['clients']} clients)"
        return reason

    def one_cluster_advice(self) -> str | None:
        return self.clusters.one_cluster_advice()

    def cluster_count_basis(self) -> str | None:
        """The clustering step's own evidence for the number of clusters: λ and how it was
        chosen, the cut's silhouette, the arrays compared (None before the step ran)."""
        if not self.state.clustered:
            return None
        cs, k = self.state.clustering_state, len(set(self.state.assignment.values()))
        silhouette = cs.get("silhouette")
        cut = (f"lambda {float(cs['lambda']):.3g} as given" if self.params.lambda_ != "auto" else
               f"lambda auto {float(cs['lambda']):.3g}, the best-silhouette cut")
        shown = "" if silhouette is None else f" at silhouette {silhouette:.3f}"
        return f"{k} clusters: {cut}{shown} of {len(cs.get('client_order', []))} clients on {', '.join(self.layer_keys)}"
