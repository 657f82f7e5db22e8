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
   ``auto``); then the nearest clusters keep merging, across pre-clusters too, until they
   are farther than ``lambda`` apart (``precluster-merge``). Every cluster model starts
   from the warm-up global model.
4. Then per-cluster FedAvg. A newcomer trains the same start model, uploads the same
   layer and joins the nearest cluster reference unless that is farther than ε
   (``epsilon``; ``auto`` = the largest distance between two references); then it founds
   a new cluster.

The machinery AdaCFL shares with FedClust is in two parts it builds: ``PartialWeights``
(the clustering step's upload, ``partial_weights.py``) and ``OneShotClusters`` (cut,
clusters, references, newcomers, ``oneshot_clusters.py``). Every extension beyond the paper
is a parameter or says why not, listed with its default in docs/algorithms/adacfl.md.

Choices the paper leaves open (documented here, all configurable):

- **Local training of the clustering step: ``cluster-epochs`` epochs, not the paper's
  single epoch**: one epoch leaves too little signal in the layer on small clients (the
  measurement: docs/algorithms/adacfl.md). ``--set adacfl.cluster-epochs=1`` gives the
  paper's step.
- **λ = auto picks one λ for all pre-clusters**: the auto cut of all clients' dendrogram
  (``cluster_auto``, with ``auto-tolerance`` below), then the paper's threshold cut at that λ inside each
  pre-cluster. A silhouette per pre-cluster is undefined for one or two clients and noisy
  for a few; the paper, too, uses one λ.
- **Clusters merge across pre-clusters while within λ** (``precluster-merge``, default
  true). The paper runs the hierarchical clustering "on" the pre-clusters and merges "the
  nearest clusters [...] until the distance between them is greater than λ"; a union of
  the pre-clusters' cuts (``precluster-merge = false``, this module's earlier reading)
  leaves clusters closer than λ apart. An auto λ that found no structure in the weights (one
  cluster) lies above every merge and would undo the pre-clusters, then the only evidence of
  groups: they stay apart. It matters with many small clients: their label
  proportions are sampling noise, so the 10 % entropy gap cuts every group into bands
  and each band's cut repeats the groups (measured: docs/algorithms/adacfl.md).
- **λ = auto takes the fewest clusters within ``auto-tolerance`` of the best silhouette**
  (default 0.05; 0 = the best cut). A group whose clients hold its classes in different
  proportions trains along two directions (mostly one digit, mostly the other), and the
  silhouette gains a few hundredths by halving it; ties already went to fewer clusters.
  A best cut that beats only the group-free reference (below ``auto-min-silhouette``) is
  bounded at sqrt(m / 2) clusters, as FedClust bounds its re-cut (``recut_max_clusters``):
  a sample of small clients holds tight handfuls of alike clients that the reference lacks.
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
training at once. Until then it holds no cluster and is not evaluated.

Known behaviour: the paper's entropy gap can isolate a client whose labels are unevenly
balanced among clients that hold the same labels evenly, so on digit pairs the ARI can be
below 1 (docs/algorithms/adacfl.md) unless ``precluster-merge`` brings it back to its group
(it does when the client lies within λ of it); ``share-label-stats = false`` avoids it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering import (
    AutoCut,
    cluster_auto,
    cluster_within_preclusters,
    entropy_preclusters,
    linkage_matrix,
    merge_across_preclusters,
)
from clusterfed.strategies.base import LABEL_STATS, ClusteredStrategy, Steps
from clusterfed.strategies.exchange import Diagnostics
from clusterfed.strategies.fedclust import recut_max_clusters
from clusterfed.strategies.oneshot import ONE_CLUSTER_REASONS, OneShotParams, OneShotState, PositiveNumber
from clusterfed.strategies.oneshot_clusters import OneShotClusters
from clusterfed.strategies.partial_weights import PartialWeights

_STATS = ("num-classes", "label-entropy")
PAPER_LAYERS = "smallest-fc"  # the paper's compared layer


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
    one_cluster_reasons = ONE_CLUSTER_REASONS
    figures = ("distance_matrix", "linkage")

    stock_alternative = "construct AdaCFL(share_label_stats=False), which needs no label statistics"

    # the parts, built on first use (the constructor stays the base's: its signature is the Params')
    @cached_property
    def partials(self) -> PartialWeights:
        return PartialWeights(self, PAPER_LAYERS, cut=self.chain_cut)

    @cached_property
    def clusters(self) -> OneShotClusters:
        return OneShotClusters(self, self.partials)

    def chain_cut(self, X: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The cut by which a stock client's chain of requests checks that the clustering has
        settled (``chain-until = stable``): the best-silhouette cut of all rows, as FedClust's."""
        return self.clusters.cut(X)

    def requires(self) -> set[str]:
        return {LABEL_STATS} if self.params.share_label_stats else set()

    def init_clusters(self) -> None:
        self.clusters.start()
        self.state.warmup_cluster = None

    @property
    def layer_keys(self) -> list[str]:
        """The arrays uploaded and compared now (``layer_choice.py``)."""
        return self.partials.keys

    def draw_sample(self, server_round: int) -> list[str] | None:
        """Placing asks clients for work: sample among all active clients first."""
        return self.sample_active()

    # ------------------------------------------------------- step 1: warm-up
    def admit(self, server_round: int, keys: list[str]) -> Steps:
        """Clients not placed yet: the warm-up cluster before the clustering step, newcomers
        (step 4) after it."""
        if self.state.clustered:
            return (yield from self.place_newcomers(server_round, keys))
        if self.state.warmup_cluster is None:
            self.state.warmup_cluster = self.new_cluster(self.state.theta0)
        for key in keys:
            self.state.assignment[key] = self.state.warmup_cluster

    # ------------------------------------------- steps 2 and 3: the clustering step
    def before_train(self, server_round: int) -> Steps:
        """At the start of round ``warmup-rounds + 1``: the sampled clients train the warm-up
        model and upload the smallest fc layer; pre-clusters by label entropy; the threshold
        cut inside each and the merge across them; every cluster model at the warm-up model."""
        if (self.state.clustered or server_round <= self.params.warmup_rounds
                or self.state.warmup_cluster is None):
            return
        keys = self.reachable(self.members(self.state.warmup_cluster))  # partial participation: the sample
        if not keys:
            return
        start = self.state.models[self.state.warmup_cluster]
        replied, X, bytes_up, diagnostics = yield from self.partials.collect(server_round, keys, start)
        if X is None:
            return diagnostics  # nobody replied: stay in warm-up, try again next round
        # clients whose reply was lost, that were not sampled or are absent leave the warm-up
        # cluster (its model goes) and come back as newcomers
        for key in [k for k, c in self.state.assignment.items() if c == self.state.warmup_cluster]:
            del self.state.assignment[key]
        del self.state.models[self.state.warmup_cluster]
        pre, preclustering, skipped = self.preclusters(replied)
        lam, auto_info = self.threshold(X)
        labels, cuts = cluster_within_preclusters(
            X, pre, lam, metric=self.params.distance, linkage=self.params.linkage,
            min_silhouette=self.params.auto_min_silhouette, return_cuts=True,
        )
        within = int(labels.max()) + 1
        # an auto λ that found no structure in the weights lies above every merge: merging at
        # it would undo the pre-clusters, then the only evidence of groups; they stay apart
        if self.params.precluster_merge and len(cuts) > 1 and auto_info.get("auto_clusters", 2) > 1:
            labels = merge_across_preclusters(X, labels, lam, metric=self.params.distance, linkage=self.params.linkage)
        info = {**self.precluster_info(replied, X, pre, cuts, preclustering), "lambda": float(lam), **auto_info,
                "clusters_within_preclusters": within}
        diagnostics.update({**skipped, **self.clusters.form(server_round, replied, X, labels, start, bytes_up, info)})
        self.clusters.say_cut(diagnostics, labels, info)
        return {**diagnostics, "preclustering": preclustering, "num_preclusters": len(cuts),
                "clusters_within_preclusters": within}

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

    def threshold(self, X: np.ndarray) -> tuple[float, dict[str, Any]]:
        """λ for every pre-cluster. ``auto``: a cut of all clients' dendrogram gives one λ,
        used inside each pre-cluster as the paper uses its one λ: the fewest clusters whose
        silhouette is within ``auto-tolerance`` of the best cut's (the best cut when it
        falls short of what group-free data reaches: then one cluster)."""
        lam = self.params.number_or_none(self.params.lambda_)
        if lam is not None:
            return lam, {}
        metric, linkage = self.params.distance, self.params.linkage

        def auto_cut(max_clusters: int) -> AutoCut:
            return cluster_auto(X, metric=metric, linkage=linkage, min_silhouette=self.params.auto_min_silhouette,
                                reference_draws=self.params.auto_reference_draws, seed=self.params.seed,
                                max_clusters=max_clusters)

        small_bound = recut_max_clusters(len(X), self.params.max_clusters)
        auto, bound = auto_cut(self.params.max_clusters), None
        if auto.num_clusters > small_bound and auto.silhouette < self.params.auto_min_silhouette:
            # structure that only beats the group-free reference: a sample of small clients,
            # whose tight groups of two or three alike clients the reference lacks; bounded
            # as FedClust bounds its re-cut
            bound = small_bound
            auto = auto_cut(bound)
        info = {"auto_best_silhouette": auto.silhouette, "auto_reference_silhouette": auto.reference,
                "auto_required_silhouette": auto.required, "auto_best_clusters": auto.num_clusters,
                "auto_clusters": auto.num_clusters, "auto_silhouette": auto.silhouette,
                "auto_tolerance": self.params.auto_tolerance, "auto_max_clusters": bound}
        if auto.num_clusters < 2:
            return auto.threshold, info
        # Clients of one group spread along their label balance (a digit pair's clients, from
        # mostly one digit to mostly the other) form elongated groups, and the silhouette
        # gains a few hundredths by halving them: a cut that much worse but with fewer
        # clusters describes the clients as well.
        floor = max(auto.silhouette - self.params.auto_tolerance * abs(auto.silhouette), auto.required)
        k = min(k for k, score in auto.scores.items() if score >= floor)
        if k == auto.num_clusters:
            return auto.threshold, info
        heights = linkage_matrix(X, metric=metric, linkage=linkage)[:, 2]
        merges = len(X) - k  # merges applied in the cut into k clusters (a threshold-reachable cut)
        info.update(auto_clusters=k, auto_silhouette=float(auto.scores[k]))
        return 0.5 * (float(heights[merges - 1]) + float(heights[merges])), info

    # -------------------------------------------------------- step 4: newcomers
    def place_newcomers(self, server_round: int, keys: list[str]) -> Steps:
        """Newcomers train the start model, upload the same layer and join the nearest
        cluster reference, or found a cluster when it is farther than ε (``epsilon``)."""
        epsilon = self.params.number_or_none(self.params.epsilon)  # None: default_epsilon of the references
        _, _, diagnostics = yield from self.clusters.place_newcomers(server_round, keys, epsilon=epsilon)
        return diagnostics

    # ------------------------------------------------------ what the run says
    def cluster_state(self) -> dict[str, Any]:
        return dict(self.state.clustering_state)

    def one_cluster_advice(self) -> str | None:
        return self.clusters.one_cluster_advice()

    def one_cluster_reason(self) -> str | None:
        """The shared reason, with the clients the clustering step saw (a sample under partial
        participation) and their median size: a small sample of small clients is where the
        silhouette cannot beat group-free data."""
        reason = self.clusters.one_cluster_reason()
        if reason is None or not self.state.clustered:
            return reason
        keys = self.state.clustering_state.get("client_order", [])
        sizes = [self.clients[key].num_examples for key in keys if key in self.clients]
        median = f", median {float(np.median(sizes)):g} examples each" if sizes else ""
        joined = len(self.state.newcomer_log)
        later = (f"; the paper clusters once, and the {joined} clients placed later joined its one cluster "
                 f"(epsilon auto is infinite with one reference)" if joined else "")
        clustering_round = self.state.clustering_state.get("clustering_round")
        return (f"{reason}; the clustering step in round {clustering_round} "
                f"saw {len(keys)} clients{median}{later}")

    def cluster_count_basis(self) -> str | None:
        """One sentence on why the run ended with this many clusters, from the cut's own
        evidence (λ and how it was chosen, silhouettes, pre-clusters, merges, clusters that
        newcomers founded); None before the clustering step."""
        if not self.state.clustered:
            return None
        cut = self.state.clustering_state  # what the clustering step recorded
        final = len(set(self.state.assignment.values()))
        lam = float(cut["lambda"])
        if "auto_clusters" not in cut:
            how = f"lambda {lam:.3g} as given"
        elif cut["auto_clusters"] < 2:
            best = cut.get("auto_best_silhouette")
            how = (f"lambda auto {lam:.3g}: one cluster, the best cut's silhouette "
                   f"{'none' if best is None else f'{best:.3f}'} below the required "
                   f"{cut.get('auto_required_silhouette') or self.params.auto_min_silhouette:.3f}")
        elif cut["auto_clusters"] == cut["auto_best_clusters"]:
            how = (f"lambda auto {lam:.3g}: the best-silhouette cut of all {len(cut['client_order'])} clients, "
                   f"{cut['auto_clusters']} clusters at silhouette {cut['auto_silhouette']:.3f}")
        else:
            how = (f"lambda auto {lam:.3g}: {cut['auto_clusters']} clusters at silhouette "
                   f"{cut['auto_silhouette']:.3f}, the fewest within auto-tolerance {cut['auto_tolerance']:g} of "
                   f"the best cut ({cut['auto_best_clusters']} clusters at {cut['auto_best_silhouette']:.3f})")
        if cut.get("auto_max_clusters"):
            how += (f" (at most {cut['auto_max_clusters']} clusters: the best cut beat only the group-free "
                    f"reference {cut['auto_reference_silhouette']:.3f}, not auto-min-silhouette "
                    f"{self.params.auto_min_silhouette})")
        pre = len(cut.get("precluster_cuts", [])) or 1
        at_clustering = len(set(cut["labels"]))
        within = cut.get("clusters_within_preclusters", at_clustering)
        if pre > 1:
            if not self.params.precluster_merge:
                merged = ", their union kept (precluster-merge = false)"
            elif cut.get("auto_clusters") == 1:
                merged = ", kept apart: the weights show no structure to merge them by"
            elif within != at_clustering:
                merged = f", merged across pre-clusters at lambda to {at_clustering}"
            else:
                merged = ", none of them within lambda of another"

            steps = f"; cut inside {pre} entropy pre-clusters into {within} clusters{merged}"
        else:
            steps = f"; one pre-cluster, cut into {at_clustering} clusters"
        founded = sum(1 for entry in self.state.newcomer_log if entry.get("new_cluster"))
        later = f"; {founded} more founded by newcomers farther than epsilon" if founded else ""
        gone = at_clustering + founded - final
        emptied = f"; {gone} left without members" if gone > 0 else ""
        return f"{final} cluster{'' if final == 1 else 's'}: {how}{steps}{later}{emptied}."
