"""The one-shot clustered strategies' shared machinery (FedClust, AdaCFL): a clustering
phase in which clients train a common start model and upload only the selected layer(s),
a distance matrix and dendrogram cut on those partial weights, per-cluster models, and
newcomers placed by the same partial upload.

Choices the papers leave open (documented here, measured in benchmarks/RESULTS.md):

- Distances are computed on the partial weights minus the start model's (what training
  changed). For L2 that is exactly the papers' distance between weights; for ``cosine``
  it compares directions of training rather than weight vectors dominated by the shared
  start.
- The cluster reference for newcomers is the mean of the members' clustering-round
  partial weights.
- Clients whose clustering reply is lost or rejected stay unplaced and are admitted as
  newcomers in a later round.
- A stock ClientApp (no profile query) trains its own run config's ``local-epochs`` and
  ignores the message's: unless its reply confirms the epochs asked (a ``local-epochs``
  metric), it is sent its own reply back until it has trained ``cluster-epochs``
  (``collect_partials``), so its row is as trained as a helper client's.

Partial participation (``fraction-train`` < 1): each round's sample is drawn among all
active clients before placement (``draw_sample``), so a client not placed yet is asked for
work only when it is sampled. The one-shot clustering is of the clients sampled in the
clustering round that replied; every other client is placed by the newcomer rule (same
start model, same partial upload, nearest reference) in the first round it is sampled, and
trains its cluster's model in that same round. Until then it has no cluster and is not
evaluated: no model was chosen for it. Every round trains exactly the sampled clients.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field
from sklearn.metrics import adjusted_rand_score, silhouette_score

from clusterfed.clustering.null_reference import DEFAULT_DRAWS
from clusterfed.clustering import (
    DEFAULT_MAX_CLUSTERS,
    cluster_auto,
    cluster_by_threshold,
    cluster_sampled,
    distance_matrix,
    linkage_matrix,
    place_newcomer,
    stack_partials,
)
from clusterfed.strategies.base import ClusteredState, ClusteredStrategy, Steps, StrategyParams
from clusterfed.strategies.exchange import UPLOAD_FULL, Arrays, Diagnostics, NewcomersPlaced, TrainReply, natural
from clusterfed.strategies.layer_choice import LayerChoice, choose, no_structure_advice, sentence, start_choice

# clusters.json keeps the square distance matrix (for the heat-map) up to this many
# clients; beyond, it would take O(m²) memory and megabytes of JSON per run
MAX_MATRIX_CLIENTS = 500


PositiveNumber = Annotated[float, Field(gt=0)]


class OneShotParams(StrategyParams):
    """The clustering step's parameters, shared by FedClust and AdaCFL."""

    cluster_epochs: int = Field(10, alias="cluster-epochs", ge=1,
                                description="local epochs of the clustering step (and of a newcomer's placement)")
    cluster_layers: str = Field("auto", alias="cluster-layers",
                                description="layers uploaded and compared: auto = the layer whose clients' updates show "
                                            "the most structure (every candidate layer uploaded once, in the "
                                            "clustering phase); final = the papers' rule; or a rule (smallest-fc, "
                                            "conv, fc, all) or layer names. Arrays no client changed are left out")
    chain_until: Literal["stable", "epochs"] = Field(
        "stable", alias="chain-until",
        description="a stock ClientApp (it trains its own local-epochs per request) is sent its reply back until "
                    "the clients' clustering is the same after two requests in a row (stable; at most "
                    "cluster-epochs in all) or until it has trained cluster-epochs (epochs, the papers' phase)")
    lambda_: PositiveNumber | Literal["auto"] = Field(
        "auto", alias="lambda", description='distance threshold of the dendrogram cut, or "auto" = the best-silhouette cut')
    distance: Literal["l2", "cosine"] = Field(
        "cosine", description="distance between the clients' partial weights (changes from the start model)")
    linkage: Literal["average", "single", "complete", "ward"] = Field("average", description="dendrogram linkage")
    auto_min_silhouette: float = Field(
        0.25, alias="auto-min-silhouette", ge=-1, le=1,
        description='lambda = "auto": below this best silhouette the clients stay one cluster (and say so), '
                    'unless it beats what group-free data of the same size reaches (auto-reference-draws)')
    auto_reference_draws: int = Field(
        DEFAULT_DRAWS, alias="auto-reference-draws", ge=0,
        description='lambda = "auto": a best cut below auto-min-silhouette still counts when it beats the best '
                    'silhouette of this many group-free reference sets, the clients\' rows rotated at random about '
                    'their mean (many small clients, or a few with large layers; 0 = fixed threshold only)')


@dataclass
class OneShotState(ClusteredState):
    clustered: bool = False
    # the model every clustering-phase client trains; newcomers train it too, so that
    # their partial weights are comparable with the cluster references
    cluster_start: Arrays = field(default_factory=dict)
    references: dict[int, np.ndarray] = field(default_factory=dict)
    layer_choice: LayerChoice = field(default_factory=LayerChoice)
    clustering_state: dict[str, Any] = field(default_factory=dict)


class OneShotClustering(ClusteredStrategy):
    """Shared machinery of the one-shot clustered strategies (FedClust, AdaCFL)."""

    Params = OneShotParams
    State = OneShotState
    layer_rule = "final"  # what ``cluster-layers = auto`` means for this strategy
    one_cluster_reasons = {
        "silhouette": "the best cut's silhouette stayed below auto-min-silhouette and below what group-free data "
                      "of the same size reaches: no cluster structure found",
        "threshold": "every client lies within lambda of the others: the cut at lambda leaves one cluster",
        "not_clustered": "the clustering step never ran (no client replied to it)",
    }
    figures = ("distance_matrix", "linkage")

    def init_clusters(self) -> None:
        self.clustered = False
        self.cluster_start = self.theta0
        self.references = {}
        self.layer_choice = start_choice(self.theta0, self.params.cluster_layers, self.compared_names(),
                                         self.select_compared_layers, self.layer_rule)
        self.clustering_state = {}

    @property
    def layer_keys(self) -> list[str]:
        """The arrays uploaded and compared now (``layer_choice.py``)."""
        return self.layer_choice.keys

    def draw_sample(self, server_round: int) -> list[str] | None:
        """Placing asks clients for work: sample among all active clients first."""
        return self.sample_active()

    def one_cluster_reason(self) -> str | None:
        """Why the run ended with one cluster (None when it has more)."""
        if len(set(self.assignment.values())) > 1:
            return None
        if not self.clustered:
            return self.one_cluster_reasons["not_clustered"]
        best = self.clustering_state.get("auto_best_silhouette")
        if self.params.lambda_ == "auto":
            shown = "none (fewer than 3 clients)" if best is None else f"{best:.3f}"
            reference = self.clustering_state.get("auto_reference_silhouette")
            noise = "" if reference is None else f", group-free data of this size reaches {reference:.3f}"
            return (f"{self.one_cluster_reasons['silhouette']} (best silhouette {shown}, "
                    f"auto-min-silhouette {self.params.auto_min_silhouette}{noise}; compared "
                    f"{', '.join(self.layer_keys)})")
        return f"{self.one_cluster_reasons['threshold']} (lambda {self.params.lambda_})"

    def cluster_count_basis(self) -> str | None:
        """The clustering step's own evidence for the number of clusters: λ and how it was
        chosen, the cut's silhouette, the arrays compared (None before the step ran)."""
        if not self.clustered:
            return None
        state, k = self.clustering_state, len(set(self.assignment.values()))
        silhouette = state.get("silhouette")
        cut = (f"lambda {float(state['lambda']):.3g} as given" if self.params.lambda_ != "auto" else
               f"lambda auto {float(state['lambda']):.3g}, the best-silhouette cut")
        shown = "" if silhouette is None else f" at silhouette {silhouette:.3f}"
        return f"{k} clusters: {cut}{shown} of {len(state.get('client_order', []))} clients on {', '.join(self.layer_keys)}"

    def one_cluster_advice(self) -> str | None:
        if not self.clustered:
            return "a longer round timeout or more clients (nobody replied to the clustering step)"
        if self.layer_choice.scores:
            return "HiCFL or CFL (they compare every round), or a lower auto-min-silhouette if the groups are close"
        return "cluster_layers='auto' (each layer scored) or HiCFL"

    # -------------------------------------------------------------- the phase
    def clustering_epochs(self) -> int:
        return self.params.cluster_epochs

    def collect_partials(self, server_round: int, keys: list[str], start: Arrays) -> Steps:
        """Train ``start`` on each of ``keys`` for ``clustering_epochs()`` and fetch only the
        selected layer(s). Returns (keys that replied, their partial weights as rows, the
        uplink bytes of this phase, its diagnostics). Clients whose reply was lost or rejected
        stay unplaced and are admitted again next round.

        A stock ClientApp trains its run config's ``local-epochs`` whatever the message asks
        and returns its whole model: unless its reply confirms the epochs asked (a
        ``local-epochs`` metric equal to them), it is sent its own reply back until it has
        trained ``stock_requests()`` times in all, so that its rows are as trained as the
        others'."""
        epochs = self.clustering_epochs()
        extra = {"local-epochs": epochs, "upload": ",".join(self.layer_keys)}
        asks = self.train_asks(server_round, keys, models={key: start for key in keys}, extra=extra, phase="cluster")
        for ask in asks:
            if self.clients[ask.key].stock:  # it sends its whole model anyway; the next request needs it
                ask.config["upload"] = UPLOAD_FULL
        received = yield asks
        bytes_up = received.bytes_up
        done, replies = [], []  # trained the epochs asked / to be sent their own reply back
        for reply in received:
            (done if self.trains_on(reply, epochs) else replies).append(reply)
        chained, requests, partitions = 0, 1, []
        for _ in range(self.stock_requests() - 1):
            if not replies or (self.params.chain_until == "stable" and self.settled(done + replies, start, partitions)):
                break
            received = yield self.train_asks(server_round, [reply.key for reply in replies],
                                             models={reply.key: reply.weights for reply in replies},
                                             extra={**extra, "upload": UPLOAD_FULL}, phase="cluster")
            bytes_up += received.bytes_up
            chained += len(replies)
            requests += 1
            replies = list(received)  # a client that fails on the way stays unplaced
        diagnostics = {"stock_chained_requests": chained, "stock_trainings": requests} if chained else {}
        replies = sorted(done + replies, key=lambda reply: natural(reply.key))
        if not replies:
            return [], None, bytes_up, diagnostics
        # rows in layer order, so every client's vector lines up. Rows are the change from
        # the start model: L2 distances are those of the weights (the papers'), and cosine
        # compares directions of training instead of weights dominated by the shared start
        # (measured on digits IID: cosine on weights split 2 of 4 seeds, on changes none).
        first_choice = not self.layer_choice.decided
        X = self.rows(replies, start)
        if first_choice:
            diagnostics["decision"] = sentence(self.layer_choice, type(self).__name__)
            diagnostics["compared_arrays"] = list(self.layer_keys)
        return [reply.key for reply in replies], X, bytes_up, diagnostics

    def rows(self, replies: list[TrainReply], start: Arrays, choice: LayerChoice | None = None) -> np.ndarray:
        """The replies' compared arrays minus ``start``'s, one row per reply; the first time,
        this settles which layer is compared (``layer_choice.choose``; on ``choice``, a trial
        copy, when given)."""
        p = self.params
        return choose(self.layer_choice if choice is None else choice, [reply.arrays for reply in replies], start,
                      metric=p.distance, linkage=p.linkage, min_silhouette=p.auto_min_silhouette,
                      reference_draws=p.auto_reference_draws, seed=p.seed)

    def settled(self, replies: list[TrainReply], start: Arrays, partitions: list[np.ndarray]) -> bool:
        """Whether the clustering of ``replies`` (cut as ``cut`` would, on a copy of the layer
        choice) is the same as after the two requests before, with more than one cluster
        and a silhouette at ``auto-min-silhouette``: a stock client's further epochs would not
        change it (``chain-until = stable``)."""
        p = self.params
        labels, info = self.cut(self.rows(replies, start, choice=copy.deepcopy(self.layer_choice)))
        partitions.append(np.asarray(labels))
        if len(partitions) < 3 or len(np.unique(labels)) < 2:
            return False
        # a cut that only beats group-free data (the lowered bar) may still move: only clear
        # structure, at the fixed bar, ends the chain early
        if p.lambda_ == "auto" and (info.get("auto_best_silhouette") or -1.0) < p.auto_min_silhouette:
            return False
        return all(adjusted_rand_score(partitions[-1], earlier) == 1.0 for earlier in partitions[-3:-1])

    def say_cut(self, diagnostics: Diagnostics, labels: np.ndarray, info: dict[str, Any]) -> None:
        """Add to the clustering round's ``decision`` the words on a cut that left one cluster:
        which arrays, the score against the bar, the setting most likely to change it."""
        if len(np.unique(labels)) > 1:
            return
        said = no_structure_advice(self.layer_choice, type(self).__name__, info.get("auto_best_silhouette"),
                                   info.get("auto_required_silhouette", self.params.auto_min_silhouette
                                            if self.params.lambda_ == "auto" else None), self.layer_rule)
        diagnostics["decision"] = "; ".join(text for text in (diagnostics.get("decision"), said) if text)

    def trains_on(self, reply: TrainReply, epochs: int) -> bool:
        """Whether ``reply`` trained the clustering step's ``epochs`` in one request: a
        clusterfed client does; a stock ClientApp only when it says so (``local-epochs``)."""
        return not self.clients[reply.key].stock or reply.metrics.get("local-epochs") == epochs

    def stock_requests(self) -> int:
        """Requests that give a stock ClientApp the clustering step's epochs: it trains its
        run config's ``local-epochs`` per request, which the server reads from its own train
        config (Flower's quickstart default, 1, when absent)."""
        per_request = max(int(self.train_config.get("local-epochs", 1) or 1), 1)
        return math.ceil(self.clustering_epochs() / per_request)

    def cut(self, X: np.ndarray, max_clusters: int = DEFAULT_MAX_CLUSTERS) -> tuple[np.ndarray, dict[str, Any]]:
        """Cluster labels of the rows of X at ``lambda`` (number or auto), and what the cut used;
        ``max_clusters`` bounds the auto cut's candidates."""
        metric, linkage = self.params.distance, self.params.linkage
        threshold = self.params.number_or_none(self.params.lambda_)
        sample = getattr(self.params, "cluster_sample", 0)
        if 0 < sample < len(X):  # many clients: cluster a sample, place the rest by nearest reference
            result = cluster_sampled(X, sample, seed=self.params.seed, metric=metric, linkage=linkage,
                                     threshold="auto" if threshold is None else threshold,
                                     min_silhouette=self.params.auto_min_silhouette, max_clusters=max_clusters)
            return result.labels, {"lambda": result.threshold, "auto_best_silhouette": result.silhouette,
                                   "cluster_sample": int(sample)}
        if threshold is None:
            auto = cluster_auto(X, metric=metric, linkage=linkage, min_silhouette=self.params.auto_min_silhouette,
                                reference_draws=self.params.auto_reference_draws, seed=self.params.seed,
                                max_clusters=max_clusters)
            # auto_best_silhouette: on the one-cluster fallback, the best score that fell short
            return auto.labels, {"lambda": auto.threshold, "auto_best_silhouette": auto.silhouette,
                                 "auto_reference_silhouette": auto.reference, "auto_required_silhouette": auto.required}
        return cluster_by_threshold(X, threshold, metric=metric, linkage=linkage), {"lambda": threshold}

    def form_clusters(self, server_round: int, keys: list[str], X: np.ndarray, labels: np.ndarray,
                      start: Arrays, bytes_up: int, info: dict[str, Any], models_from: Arrays | None = None) -> Diagnostics:
        """Make one cluster per label, every model at ``models_from`` (default ``start``, the
        model the rows of X were trained from and newcomers will train); store references
        and the state for the figures; returns the clustering's diagnostics."""
        first = start if models_from is None else models_from
        cluster_of_label = {int(label): self.new_cluster(first) for label in np.unique(labels)}
        for key, label in zip(keys, labels):
            self.assignment[key] = cluster_of_label[int(label)]
        # reference = mean of the members' clustering-round partial weights (our choice: the papers leave it open)
        self.references = {cluster_of_label[int(label)]: X[labels == label].mean(axis=0) for label in np.unique(labels)}
        small = len(keys) <= MAX_MATRIX_CLIENTS
        D = distance_matrix(X, self.params.distance) if small else None
        silhouette = _silhouette(D, labels) if small else None
        # the dendrogram is for figures; with a sampled clustering it would cost O(m²) memory
        Z = (linkage_matrix(X, metric=self.params.distance, linkage=self.params.linkage)
             if 1 < len(keys) and (small or "cluster_sample" not in info) else None)
        self.clustered = True
        self.cluster_start = start
        self.clustering_state = {
            "clustering_round": server_round,
            "final_clustering_round": server_round,  # one-shot: the same; the grid's column for every strategy
            "layers": list(self.layer_keys),
            "layer_choice": self.layer_choice.record(),
            "distance": self.params.distance,
            "vectors": "partial weights minus the start model's (L2 distances equal the weights')",
            "linkage_method": self.params.linkage,
            "lambda": info["lambda"],
            "silhouette": silhouette,
            "client_order": list(keys),
            "labels": [self.assignment[key] for key in keys],
            "distance_matrix": None if D is None else D.round(6).tolist(),
            "linkage": None if Z is None else Z.tolist(),
            **{k: v for k, v in info.items() if k != "lambda"},
        }
        return {
            "clustering_bytes_up": bytes_up,
            "lambda_used": info["lambda"],
            "silhouette": silhouette,
            **({"auto_best_silhouette": info["auto_best_silhouette"]} if "auto_best_silhouette" in info else {}),
        }

    # ------------------------------------------------------------- newcomers
    def newcomer_epsilon(self) -> float | None:
        """ε for ``place_newcomer``: inf = never found a new cluster (FedClust)."""
        return math.inf

    def place_newcomers(self, server_round: int, keys: list[str]) -> Steps:
        """Place each of ``keys`` sampled this round at its nearest cluster reference.
        Returns (the keys that replied, their partial weights as rows or None, the diagnostics)."""
        keys = self.reachable(keys)  # only this round's sampled clients are asked
        if not keys:
            return [], None, {}
        replied, X, bytes_up, diagnostics = yield from self.collect_partials(server_round, keys, self.cluster_start)
        diagnostics["newcomer_bytes_up"] = bytes_up
        if X is None:
            return [], None, diagnostics
        placed = NewcomersPlaced([])
        for key, x in zip(replied, X):
            cluster, distance = place_newcomer(x, self.references, epsilon=self.newcomer_epsilon(),
                                               metric=self.params.distance)
            founded = cluster is None
            if founded:
                cluster = self.new_cluster(self.cluster_start)
                self.references[cluster] = x.copy()  # later newcomers may join it
            self.assignment[key] = cluster
            placed.entries.append({"round": server_round, "client": key, "cluster": cluster,
                                   "distance": float(distance), "new_cluster": founded})
        self.newcomer_log.extend(placed.entries)
        self.reports.append(placed)
        diagnostics["newcomers_placed"] = len(replied)
        return replied, X, diagnostics

    def cluster_state(self) -> dict[str, Any]:
        return dict(self.clustering_state)


def _silhouette(D: np.ndarray, labels: np.ndarray) -> float | None:
    """Silhouette of a partition on precomputed distances; None where undefined (K < 2 or K = m)."""
    k = len(np.unique(labels))
    if not 2 <= k <= len(labels) - 1:
        return None
    return float(silhouette_score(D, labels, metric="precomputed"))
