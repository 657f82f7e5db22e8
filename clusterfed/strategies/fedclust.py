"""FedClust (Islam et al., "FedClust: Tackling Data Heterogeneity in Federated Learning
through Weight-Driven Client Clustering", ICPP 2024): one-shot clustering on the final
layer's weights, then per-cluster FedAvg.

The paper's Algorithm 1 and 2, in their order:

- Alg. 1, lines 2-5 (round i = 0, ``clustering_round``): θ0 to every available client; each
  trains it (``cluster-epochs``, the paper's E = 10) and sends back its final layer's weights
  (``cluster-layers``); the server builds the proximity matrix M (``distance``; the
  paper's Eq. 3 is L2), cuts the hierarchical clustering at λ (``lambda``): C1..Cm =
  HC(M, λ), and starts every cluster model at θ0.
- Alg. 1, lines 7-13 (every later round, the base's round): a sample of ``max(R·N, 1)``
  clients (``fraction-train``) trains its cluster's model; each cluster's model is its
  members' average weighted by |D_k|.
- Alg. 2, lines 1-4 (``place_newcomers``): a client with no cluster trains θ0, sends the
  same partial weights and joins g* = argmin_g dist(θ̂_new, θ̂_g) (Eq. 4); FedClust never
  founds a cluster.

Extensions, each a parameter (``PAPER`` switches them off; docs/algorithms/fedclust.md
lists each with its default and its measurement): the compared layer chosen by evidence
(``cluster-layers = auto``, ``layer_choice.py``), cosine distance on the changes from θ0,
``lambda = auto`` (the best-silhouette cut against group-free data,
``clustering/null_reference.py``), a stock ClientApp's reply sent back until the cut settles
(``chain-until``), a cut of a sample (``cluster-sample``), the step run once more on the
trained model when it left one cluster (``retry-after``, ``retry.py``) and, under partial
participation, the re-cut of a first sample that showed no groups (``recut``, below). The machinery shared
with AdaCFL (the partial upload, the cut, the clusters and references) is ``oneshot.py``'s,
as functions of the state; what the run says is ``clusterfed/explain/oneshot.py``'s.

Partial participation (``fraction-train`` < 1): the clustering round asks every active client
(``cluster-all-active``; false: the first round's sample), its training the round's sample; a
client that joins later is placed as a newcomer in the first round it is sampled. A first sample
too small to show the groups (``lambda = auto`` found one cluster): the partial weights of
every client placed in the one cluster are kept and cut again, into at most sqrt(n / 2)
clusters (``recut_max_clusters``), each time their number n has doubled; the first cut that
finds clusters forms them from the one cluster's current model. With every client in the
first round there is nothing to add, and the run is the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from clusterfed.clustering import place_newcomer
from clusterfed.clustering.oneshot import recut_max_clusters
from clusterfed.explain import oneshot as explain
from clusterfed.strategies import merge_probe, oneshot, retry
from clusterfed.strategies.base import ClusteredStrategy, Steps
from clusterfed.core.exchange import Arrays, ClientInfo, Diagnostics, Round, natural
from clusterfed.strategies.oneshot import OneShotParams, OneShotState

PAPER_LAYERS = "final"  # the paper's compared layer


class FedClustParams(OneShotParams):
    cluster_sample: int = Field(0, alias="cluster-sample", ge=0,
                                description="cluster this many sampled clients with the full method and place the "
                                            "rest at the nearest cluster reference (0 = cluster all)")
    retry_after: int = retry.after_field(4, " (its updates show groups a model at its start does not yet)")
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
    one_cluster_reasons = explain.ONE_CLUSTER_REASONS
    figures = ("distance_matrix", "linkage")
    # the paper, no extension: its final layer, L2 distance, the full clustering phase, one
    # cut. λ is the paper's input with no published value: give it, FedClust.paper(lambda_=...)
    PAPER: ClassVar[dict[str, Any]] = {"cluster_layers": PAPER_LAYERS, "distance": "l2", "cluster_epochs": 10,
                                       "chain_until": "epochs", "cluster_sample": 0, "recut": False, "cluster_all_active": True,
                                       "reproduce": False, "revisit": False, "merge_probe": False, "retry_after": 0}

    def init_clusters(self) -> None:
        oneshot.start(self.state, self.params, self.compared_names(), PAPER_LAYERS, name=self.name)

    @property
    def layer_keys(self) -> list[str]:
        """The arrays uploaded and compared now (``layer_choice.py``)."""
        return self.state.layer_choice.keys

    def draw_sample(self, rnd: Round) -> list[str] | None:
        """Placing asks clients for work: sample among all active clients first; the
        clustering round asks every active client (Alg. 1, ``cluster-all-active``)."""
        due = not self.state.clustered or retry.due(self.state, self.params, rnd.number)
        return oneshot.round_sample(self, rnd, clustering=due)

    def admit(self, rnd: Round, keys: list[str]) -> Steps:
        """Clients not placed yet: the clustering round (Alg. 1) until it has run, then newcomers (Alg. 2)."""
        if self.state.clustered:
            return (yield from self.place_newcomers(rnd, keys))
        return (yield from self.clustering_round(rnd, keys))

    # ------------------------------------------- Alg. 1, lines 2-5: the clustering round
    def clustering_round(self, rnd: Round, keys: list[str]) -> Steps:
        """The ``keys`` asked this round (every active client, or the round's sample) train θ0
        and upload the compared layer; the proximity matrix of their partial weights is cut at
        λ and every cluster model starts at θ0."""
        keys = rnd.reachable(keys)  # those draw_sample asked (cluster-all-active: every active client)
        if not keys:
            return
        theta0 = self.state.theta0
        replied, X, bytes_up, diagnostics, halves = yield from self.collect(rnd, keys, theta0)
        if X is None:
            return diagnostics  # nobody replied: try again next round
        labels, info, said, deferred = self.gated_cut(X, halves, replied)
        if deferred:
            info = {**info, "deferred": said}
        clusters = {int(label): self.new_cluster(theta0) for label in np.unique(labels)}
        diagnostics.update(oneshot.form(self.state, self.params, rnd.number, replied, X, labels, clusters, theta0,
                                        bytes_up, info))
        if said:
            diagnostics["decision"] = "; ".join(t for t in (diagnostics.get("decision"), said) if t)
        if "deferred" not in info:
            oneshot.say_cut(diagnostics, labels, info, self.state, self.params, type(self).__name__, PAPER_LAYERS)
        if self.params.recut and self.params.lambda_ == "auto" and len(clusters) == 1:
            # float32, as the clients sent them: half the memory, a cut of the same labels
            self.state.unclustered = dict(zip(replied, X.astype(np.float32)))
            self.state.recut_at = 2 * len(replied)
        return diagnostics

    def collect(self, rnd: Round, keys: list[str], start: Arrays) -> Steps:
        """``keys`` train ``start`` and upload the compared arrays (``oneshot.collect``)."""
        asks = self.train_asks(rnd, keys, models=dict.fromkeys(keys, start),
                               extra=oneshot.cluster_extra(self.state, self.params), phase="cluster")
        return (yield from oneshot.collect(asks, start, self.state, self.params, stock=oneshot.stock(rnd.clients),
                                           local_epochs=rnd.train_config.get("local-epochs", 1),
                                           strategy=type(self).__name__, sample=self.params.cluster_sample))

    def cut(self, X: np.ndarray, max_clusters: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """HC(M, λ): the rows of X cut at ``lambda`` into at most ``max_clusters`` (default
        ``max-clusters``; ``cluster-sample`` > 0: a cut of a sample, the rest placed at the
        nearest reference); labels and what the cut used."""
        return oneshot.cut(X, self.params, max_clusters=max_clusters, sample=self.params.cluster_sample)

    # ------------------------------------------------- extension: the step retried
    def before_train(self, rnd: Round) -> Steps:
        """The clustering step once more when it left one cluster ``retry-after`` rounds ago
        (``retry.py``), cut by the same gated cut."""
        if retry.due(self.state, self.params, rnd.number):
            return (yield from retry.run(self, rnd, PAPER_LAYERS, self.gated_cut))
        return None

    def gated_cut(self, X: np.ndarray, halves: Any, keys: list[str]) -> tuple[np.ndarray, dict[str, Any], str | None, bool]:
        """The clustering step's cut of X (``keys``' rows; ``halves``: the chain's), gated
        (``oneshot.gate``): the labels taken, the cut's info (with the reproduction), what the gate
        said, whether it deferred."""
        labels, info = self.cut(X)
        labels, reproduction, said, deferred = oneshot.gate(X, labels, halves, self.params, type(self).__name__,
                                                            keys=keys, tests=self.state.layer_choice.chosen_among)
        if reproduction is not None:
            info = {**info, "reproduction": reproduction.as_record()}
        return labels, info, said, deferred

    # ---------------------------------------------------- Alg. 2: newcomers
    def place_newcomers(self, rnd: Round, keys: list[str]) -> Steps:
        """Newcomers train θ0, upload the same layer and join the nearest cluster reference
        (ε = inf: FedClust never founds a cluster); while the first cut left one cluster,
        their rows are kept for the re-cut."""
        keys = rnd.reachable(keys)  # only this round's sampled clients are asked
        if not keys:
            return {}
        replied, X, bytes_up, diagnostics, _ = yield from self.collect(rnd, keys, self.state.cluster_start)
        diagnostics["newcomer_bytes_up"] = bytes_up
        if X is None:
            return diagnostics
        placements = []
        for key, x in zip(replied, X):  # g* = argmin_g dist(θ̂_new, θ̂_g)
            cluster, distance = place_newcomer(x, self.state.references, epsilon=math.inf, metric=self.params.distance)
            self.state.assignment[key] = cluster
            placements.append((key, cluster, distance, False))
        rnd.reports.append(oneshot.placed(self.state, rnd.number, placements))
        diagnostics["newcomers_placed"] = len(replied)
        if self.state.recut_at:
            self.state.unclustered.update(zip(replied, X.astype(np.float32)))
            if len(self.state.unclustered) >= self.state.recut_at:
                diagnostics.update(self.recut(rnd.number, len(rnd.clients)))
        return diagnostics

    # ------------------------------------------------- extension: the re-cut
    def recut(self, server_round: int, known: int) -> Diagnostics:
        """Cut the kept partial weights of the one cluster's members again (a grown sample);
        on clusters, form them from the one cluster's current model; ``known``: how many clients
        the run knows. Returns the diagnostics."""
        if len(self.state.models) != 1:  # the revisits split the one cluster meanwhile: they took over
            self.state.unclustered, self.state.recut_at = {}, 0
            return {}
        keys = sorted(self.state.unclustered, key=natural)
        X = np.stack([self.state.unclustered[key] for key in keys], dtype=np.float64)
        bound = recut_max_clusters(len(keys), self.params.max_clusters)
        labels, info = self.cut(X, max_clusters=bound)
        labels, _, said, deferred = oneshot.gate(X, labels, None, self.params, type(self).__name__, keys=keys,
                                                 max_clusters=bound,
                                                 tests=self.state.layer_choice.chosen_among)
        clusters = len(np.unique(labels))
        self.state.recuts.append({"round": server_round, "clients": len(keys), "max_clusters": bound,
                                  "clusters": int(clusters), "best_silhouette": info.get("auto_best_silhouette"),
                                  "required_silhouette": info.get("auto_required_silhouette"),
                                  **({"deferred": said} if deferred else {})})
        diagnostics = {"recut_clients": len(keys), **({"decision": said} if said else {})}
        if clusters == 1:
            if len(keys) >= known:  # every known client was cut: nothing left to grow
                self.state.unclustered, self.state.recut_at = {}, 0
            else:  # next when the sample has doubled or holds every known client
                self.state.recut_at = min(2 * len(keys), known)
            self.state.clustering_state.update({k: v for k, v in info.items() if k != "lambda"})
            return diagnostics
        (single,) = set(self.state.models)
        current = self.state.models.pop(single)
        first_round = self.state.clustering_state["clustering_round"]
        made = {int(label): self.new_cluster(current) for label in np.unique(labels)}
        diagnostics.update(oneshot.form(self.state, self.params, server_round, keys, X, labels, made,
                                        self.state.theta0, 0, info))
        self.state.clustering_state["clustering_round"] = first_round
        self.state.unclustered, self.state.recut_at = {}, 0
        return diagnostics

    # ------------------------------------------------- extension: revisits
    def train(self, rnd: Round, trainers: list[str]) -> Steps:
        """The round's training, and a probed cluster's members also on another's model (``merge_probe.py``)."""
        return (yield from merge_probe.train(self, rnd, trainers))

    def after_train(self, rnd: Round, replies: list) -> Diagnostics | None:
        """The clusters revisited on the round's training updates (``revisit.revisit``), probes judged."""
        return merge_probe.after_train(self, rnd, replies)

    # ------------------------------------------------------ what the run says
    def cluster_state(self) -> dict[str, Any]:
        recuts, revisits = self.state.recuts, self.state.revisits
        return {**self.state.clustering_state, **({"recuts": list(recuts)} if recuts else {}),
                **({"revisits": list(revisits)} if revisits else {}), **merge_probe.record(self.state)}

    def one_cluster_reason(self, clients: Mapping[str, ClientInfo] | None = None) -> str | None:
        return explain.fedclust_reason(self.state, self.params, self.one_cluster_reasons)

    def one_cluster_advice(self) -> str | None:
        return explain.one_cluster_advice(self.state, self.params)

    def cluster_count_basis(self) -> str | None:
        return explain.fedclust_count_basis(self.state, self.params)
