"""AdaCFL (Gong et al., "Adaptive Clustered Federated Learning for Heterogeneous Data in
Edge Computing", Mobile Networks and Applications 2022): FedAvg warm-up, entropy
pre-clustering, threshold clustering on the smallest fully connected layer, per-cluster
FedAvg, newcomers with the ε rule.

The paper's steps (Sect. 5, Algorithms 1 and 2), in their order:

- Warm-up (Sect. 5, "after several communication rounds [...] as described in FedAvg";
  ``admit``): ``warmup-rounds`` rounds of FedAvg, every client in one cluster.
- Alg. 1, lines 1-5 (``preclusters``): each client reports the number of classes it holds
  ``L_c`` and the Shannon entropy ``s_c`` of its labels (``share-label-stats``: the
  clients' profiles carry them).
- Alg. 1, line 6 (``preclusters``): clients with the same ``L_c`` and entropies within a
  10 % gap (``entropy-gap``) form a pre-cluster.
- Alg. 1, lines 7-8 (``before_train``, at the start of round ``warmup-rounds + 1``): every
  client trains the warm-up global model and uploads its smallest fc layer (``cluster-layers``,
  Sect. 5's ``argmin ||θ^[a]||_l1``); the server computes each pre-cluster's distance matrix
  (L2), cuts it at λ (``lambda``, the paper's 1.4) and merges the nearest clusters until they
  are farther than λ apart (``precluster-merge``: across pre-clusters too, our reading of
  "HC on the clusters G0"); every cluster model starts at the warm-up model.
- Per-cluster FedAvg in every later round (the base's round).
- Alg. 2, lines 1-4 and Eq. 5 (``place_newcomers``): a newcomer trains the same start model,
  uploads the same layer and joins g* = argmin_g dist(θ̂_new, θ̂_g), unless that is farther
  than ε (``epsilon``: the paper's 1.8, or ``auto`` = the largest distance between two
  references, the paper's "in practice" rule); then it founds a cluster.

Extensions and the choices the paper leaves open, each a parameter (``PAPER`` switches
them off; docs/algorithms/adacfl.md lists each with its default and its measurement):
``cluster-epochs`` (default 10, the paper's 1), the layer chosen by evidence
(``cluster-layers = auto``), cosine distance on the changes from the start model,
``lambda = auto`` (one λ for all pre-clusters: the fewest clusters within
``auto-tolerance`` of the best silhouette, at most sqrt(m / 2) clusters when the cut beats
only the group-free reference, ``clustering/oneshot.py``), pre-clustering skipped when the
median client holds fewer than ``entropy-min-per-class`` examples per class (its class
count is then sampling noise; skipped too when any client did not report its statistics),
a stock ClientApp's reply sent back (``chain-until``) and, when asked for (``retry-after``,
``retry.py``; off by default), the step run once more on the trained model when it left one
cluster. The clustering step is its own
phase (partial upload) before that round's training; its start model, a newcomer's and a
founded cluster's is the warm-up global model (θ0 when ``warmup-rounds = 0``). The machinery
shared with FedClust is ``oneshot.py``'s; what the run says is ``clusterfed/explain/oneshot.py``'s.

Partial participation (``fraction-train`` < 1): the warm-up is FedAvg over each round's
sample; the clustering step of round ``warmup-rounds + 1`` asks every active client
(``cluster-all-active``; false: that round's sample, every other client leaving the warm-up
cluster, whose model is gone, to be placed by the newcomer rule in the first round it is
sampled).

Known behaviour: the paper's entropy gap can isolate a client whose labels are unevenly
balanced among clients that hold the same labels evenly (docs/algorithms/adacfl.md) unless
``precluster-merge`` brings it back to its group; ``share-label-stats = false`` avoids it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering import (
    cluster_by_threshold,
    cluster_within_preclusters,
    entropy_preclusters,
    merge_across_preclusters,
    place_newcomer,
)
from clusterfed.clustering.oneshot import precluster_records, tolerant_threshold
from clusterfed.explain import oneshot as explain
from clusterfed.strategies import merge_probe, oneshot, retry
from clusterfed.strategies.base import LABEL_STATS, ClusteredStrategy, Steps
from clusterfed.core.exchange import Arrays, ClientInfo, Diagnostics, Round
from clusterfed.strategies.oneshot import OneShotParams, OneShotState, PositiveNumber

_STATS = ("num-classes", "label-entropy")
PAPER_LAYERS = "smallest-fc"  # the paper's compared layer (Sect. 5: the layer with the fewest weights)


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
    precluster_merge: bool = Field(
        True, alias="precluster-merge",
        description="after the cut inside each pre-cluster, keep merging the nearest clusters across pre-clusters "
                    "while they are at most lambda apart (the paper's stop rule; false: the union of the cuts)")
    auto_tolerance: float = Field(
        0.05, alias="auto-tolerance", ge=0, lt=1,
        description='lambda = "auto": the fewest clusters whose silhouette is within this fraction of the best '
                    'cut\'s (0: the best cut)')
    retry_after: int = retry.after_field(0, never="the paper's single clustering step: the step already compares "
                                                  "the warm-up model's updates, and a later look found no clusters "
                                                  "on the development cells where it ran")
    epsilon: PositiveNumber | Literal["auto"] = Field(
        "auto", description='newcomer distance above which it founds a new cluster; "auto" = the largest '
                            'distance between two cluster references')


@dataclass
class AdaCFLState(OneShotState):
    warmup_cluster: int | None = None


class AdaCFL(ClusteredStrategy):
    """AdaCFL: warm-up, entropy pre-clustering, threshold clustering on the smallest fc layer."""

    name = "adacfl"
    Params = AdaCFLParams
    State = AdaCFLState
    params: AdaCFLParams
    state: AdaCFLState
    one_cluster_reasons = explain.ONE_CLUSTER_REASONS
    figures = ("distance_matrix", "linkage")
    # the paper, no extension: its λ = 1.4 and ε = 1.8 (Sect. 6.1), one epoch, the smallest fc
    # layer, L2, pre-clustering whatever the clients' sizes; precluster-merge stays our reading
    PAPER: ClassVar[dict[str, Any]] = {
        "lambda_": 1.4, "epsilon": 1.8, "cluster_epochs": 1, "cluster_layers": PAPER_LAYERS, "distance": "l2",
        "chain_until": "epochs", "share_label_stats": True, "entropy_gap": 0.1, "entropy_min_per_class": 0.0,
        "precluster_merge": True, "reproduce": False, "revisit": False, "merge_probe": False, "cluster_all_active": True,
        "retry_after": 0}

    def requires(self) -> set[str]:
        """Nothing beyond a stock ClientApp: label statistics are asked for (``wants``) and used
        when every client gives them; otherwise pre-clustering is skipped, and the round line says why."""
        return set()

    def wants(self) -> set[str]:
        """What the clients are asked for when they can give it (the profile probe)."""
        return {LABEL_STATS} if self.params.share_label_stats else set()

    def init_clusters(self) -> None:
        oneshot.start(self.state, self.params, self.compared_names(), PAPER_LAYERS, name=self.name)
        self.state.warmup_cluster = None

    @property
    def layer_keys(self) -> list[str]:
        """The arrays uploaded and compared now (``layer_choice.py``)."""
        return self.state.layer_choice.keys

    def draw_sample(self, rnd: Round) -> list[str] | None:
        """Placing asks clients for work: sample among all active clients first; the
        clustering step's round asks every active client (``cluster-all-active``)."""
        due = ((not self.state.clustered and rnd.number > self.params.warmup_rounds)
               or retry.due(self.state, self.params, rnd.number))
        return oneshot.round_sample(self, rnd, clustering=due)

    # ---------------------------------------------------------------- warm-up
    def admit(self, rnd: Round, keys: list[str]) -> Steps:
        """Clients not placed yet: the warm-up cluster before the clustering step, newcomers
        (Alg. 2) after it."""
        if self.state.clustered:
            return (yield from self.place_newcomers(rnd, keys))
        first = self.state.warmup_cluster is None
        if first:
            self.state.warmup_cluster = self.new_cluster(self.state.theta0)
        for key in keys:
            self.state.assignment[key] = self.state.warmup_cluster
        if first and self.params.warmup_rounds > 0:  # round 1 names what the clustering step will compare
            return {"decision": explain.warmup_said(self.state.layer_choice, type(self).__name__,
                                                    self.params.warmup_rounds, self.params.warmup_rounds + 1)}
        return None

    # ------------------------------------------------- Alg. 1: the clustering step
    def before_train(self, rnd: Round) -> Steps:
        """At the start of round ``warmup-rounds + 1``: the clients asked (every active one, or
        the round's sample) train the warm-up model and upload the compared layer; pre-clusters by label entropy; the threshold
        cut inside each and the merge across them; every cluster model at the warm-up model. A step that
        left one cluster runs once more ``retry-after`` rounds later (``retry.py``)."""
        if retry.due(self.state, self.params, rnd.number):
            return (yield from retry.run(self, rnd, PAPER_LAYERS, lambda X, halves, keys: self.gated_cut(
                X, halves, keys, *self.preclusters(keys, rnd.clients)[:2])))
        warmup = self.state.warmup_cluster
        if self.state.clustered or rnd.number <= self.params.warmup_rounds or warmup is None:
            return
        keys = rnd.reachable(self.members(rnd, warmup))  # those draw_sample asked
        if not keys:
            return
        start = self.state.models[warmup]
        replied, X, bytes_up, diagnostics, halves = yield from self.collect(rnd, keys, start)
        if X is None:
            return diagnostics  # nobody replied: stay in warm-up, try again next round
        # clients whose reply was lost, that were not sampled or are absent leave the warm-up
        # cluster (its model goes) and come back as newcomers
        for key in [k for k, c in self.state.assignment.items() if c == warmup]:
            del self.state.assignment[key]
        del self.state.models[warmup]
        pre, preclustering, skipped = self.preclusters(replied, rnd.clients)  # lines 1-6
        labels, info, said, deferred = self.gated_cut(X, halves, replied, pre, preclustering)
        clusters = {int(label): self.new_cluster(start) for label in np.unique(labels)}
        diagnostics.update({**skipped, **oneshot.form(self.state, self.params, rnd.number, replied, X, labels,
                                                      clusters, start, bytes_up, info)})
        said = "; ".join(t for t in (diagnostics.get("decision"), explain.preclustering_said(skipped, type(self).__name__),
                                     said) if t)
        if said:
            diagnostics["decision"] = said
        if "deferred" not in info:
            oneshot.say_cut(diagnostics, labels, info, self.state, self.params, type(self).__name__, PAPER_LAYERS)
        return {**diagnostics, "preclustering": preclustering, "num_preclusters": len(info["precluster_cuts"]),
                "clusters_within_preclusters": info["clusters_within_preclusters"]}

    def gated_cut(self, X: np.ndarray, halves: Any, keys: list[str], pre: np.ndarray,
                  preclustering: bool) -> tuple[np.ndarray, dict[str, Any], str | None, bool]:
        """The clustering step's cut of X (``keys``' rows; ``halves``: the chain's; ``pre``: their
        pre-clusters, ``preclustering``: whether pre-clustering ran): the threshold cut inside each
        pre-cluster and the merge across them (Alg. 1, lines 7-8), gated (``oneshot.gate``, the
        pre-clusters its fallback). Returns the labels taken, the cut's info, what the gate said,
        whether it deferred."""
        p = self.params
        lam, auto_info = self.threshold(X)
        labels, cuts = cluster_within_preclusters(X, pre, lam, metric=p.distance, linkage=p.linkage,
                                                  min_silhouette=p.auto_min_silhouette, return_cuts=True)
        within = int(labels.max()) + 1
        # an auto λ that found no structure in the weights lies above every merge: merging at
        # it would undo the pre-clusters, then the only evidence of groups; they stay apart
        if p.precluster_merge and len(cuts) > 1 and auto_info.get("auto_clusters", 2) > 1:
            labels = merge_across_preclusters(X, labels, lam, metric=p.distance, linkage=p.linkage)
        labels, reproduction, said, deferred = oneshot.gate(X, labels, halves, p, type(self).__name__,
                                                            fallback=pre, keys=keys,
                                                            tests=self.state.layer_choice.chosen_among)
        if reproduction is not None:
            auto_info = {**auto_info, "reproduction": reproduction.as_record()}
        if deferred:
            auto_info = {**auto_info, "deferred": said}
        info = {"preclustering": preclustering, "preclusters": [int(c) for c in pre],
                "precluster_cuts": precluster_records(keys, X, pre, cuts, metric=p.distance, linkage=p.linkage),
                "lambda": float(lam), **auto_info, "clusters_within_preclusters": within}
        return labels, info, said, deferred

    def collect(self, rnd: Round, keys: list[str], start: Arrays) -> Steps:
        """``keys`` train ``start`` and upload the compared arrays (``oneshot.collect``)."""
        asks = self.train_asks(rnd, keys, models=dict.fromkeys(keys, start),
                               extra=oneshot.cluster_extra(self.state, self.params), phase="cluster")
        return (yield from oneshot.collect(asks, start, self.state, self.params, stock=oneshot.stock(rnd.clients),
                                           local_epochs=rnd.train_config.get("local-epochs", 1),
                                           strategy=type(self).__name__, cut_rule=self.weight_cut))

    def weight_cut(self, X: np.ndarray) -> np.ndarray:
        """The cut of the weights alone (no pre-clusters) at this strategy's λ: what a chain's
        halves must both show for the chain to end."""
        lam, _ = self.threshold(X)
        return cluster_by_threshold(X, lam, metric=self.params.distance, linkage=self.params.linkage)

    def preclusters(self, keys: list[str], clients: Mapping[str, ClientInfo]) -> tuple[np.ndarray, bool, Diagnostics]:
        """Entropy pre-cluster per client (Alg. 1, lines 1-6), whether pre-clustering ran at
        all, and the diagnostics (why it was skipped); ``clients``: the round's client table."""
        stats = [clients[key].label_stats for key in keys]
        if not self.params.share_label_stats:
            return np.zeros(len(keys), dtype=np.int64), False, {}
        lacking = [key for key, st in zip(keys, stats) if any(s not in (st or {}) for s in _STATS)]
        if lacking:  # a stock ClientApp has no profile: its labels are unknown to the server
            stock = sum(1 for key in lacking if clients[key].stock)
            skipped = (f"{len(lacking)} of {len(keys)} clients gave no label statistics"
                       + (f" ({stock} stock ClientApps)" if stock else ""))
            return np.zeros(len(keys), dtype=np.int64), False, {"preclustering_skipped": skipped}
        per_class = float(np.median([clients[key].num_examples / max(int(st["num-classes"]), 1)
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

    def threshold(self, X: np.ndarray) -> tuple[float, dict[str, Any]]:
        """λ for every pre-cluster: the given one, or under ``auto`` one λ from a cut of all
        clients' dendrogram, used inside each pre-cluster as the paper uses its one λ
        (``clustering.oneshot.tolerant_threshold``)."""
        lam = self.params.number_or_none(self.params.lambda_)
        if lam is not None:
            return lam, {}
        p = self.params
        return tolerant_threshold(X, metric=p.distance, linkage=p.linkage, min_silhouette=p.auto_min_silhouette,
                                  reference_draws=p.auto_reference_draws, seed=p.seed, max_clusters=p.max_clusters,
                                  tolerance=p.auto_tolerance)

    # -------------------------------------------------------- Alg. 2: newcomers
    def place_newcomers(self, rnd: Round, keys: list[str]) -> Steps:
        """Newcomers train the start model, upload the same layer and join the nearest
        cluster reference, or found a cluster when it is farther than ε (``epsilon``; auto:
        the largest distance between two references, ``place_newcomer``'s default)."""
        keys = rnd.reachable(keys)  # only this round's sampled clients are asked
        if not keys:
            return {}
        start = self.state.cluster_start
        replied, X, bytes_up, diagnostics, _ = yield from self.collect(rnd, keys, start)
        diagnostics["newcomer_bytes_up"] = bytes_up
        if X is None:
            return diagnostics
        epsilon = self.params.number_or_none(self.params.epsilon)
        placements = []
        for key, x in zip(replied, X):  # Eq. 5, or a new cluster beyond ε
            cluster, distance = place_newcomer(x, self.state.references, epsilon=epsilon, metric=self.params.distance)
            founded = cluster is None
            if founded:
                cluster = self.new_cluster(start)
                self.state.references[cluster] = x.copy()  # later newcomers may join it
            self.state.assignment[key] = cluster
            placements.append((key, cluster, distance, founded))
        rnd.reports.append(oneshot.placed(self.state, rnd.number, placements))
        diagnostics["newcomers_placed"] = len(replied)
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
        revisits = self.state.revisits
        return {**self.state.clustering_state, **({"revisits": list(revisits)} if revisits else {}), **merge_probe.record(self.state)}

    def one_cluster_reason(self, clients: Mapping[str, ClientInfo] | None = None) -> str | None:
        sizes = {key: client.num_examples for key, client in (clients or {}).items()}
        return explain.adacfl_reason(self.state, self.params, self.one_cluster_reasons, sizes)

    def one_cluster_advice(self) -> str | None:
        return explain.one_cluster_advice(self.state, self.params)

    def cluster_count_basis(self) -> str | None:
        return explain.adacfl_count_basis(self.state, self.params)
