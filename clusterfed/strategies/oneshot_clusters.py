"""The clusters of a one-shot clustering (FedClust, AdaCFL): the dendrogram cut of the
clients' partial weights, one cluster model per label, the cluster references, and the
newcomers placed at the nearest reference; and what the run says about its number of
clusters.

Choices the papers leave open:

- The cluster reference for newcomers is the mean of the members' clustering-round
  partial weights.
- ``lambda = auto`` (beyond the papers): the best-silhouette cut, kept when its
  silhouette reaches ``auto-min-silhouette`` or beats what group-free data of the same size
  and shape reaches (``clustering/null_reference.py``); else one cluster, said in words.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sklearn.metrics import silhouette_score

from clusterfed.clustering import (
    cluster_auto,
    cluster_by_threshold,
    cluster_sampled,
    distance_matrix,
    linkage_matrix,
    place_newcomer,
)
from clusterfed.strategies.exchange import Arrays, Diagnostics, NewcomersPlaced, Steps
from clusterfed.strategies.layer_choice import no_structure_advice
from clusterfed.strategies.oneshot import ONE_CLUSTER_REASONS, OneShotHost, OneShotPart
from clusterfed.strategies.partial_weights import PartialWeights


class OneShotClusters(OneShotPart):
    """The cut, clusters, references and newcomers of ``strategy``'s one-shot clustering
    (a part it builds); ``partials``, the strategy's other part, collects a newcomer's
    partial weights and knows the compared arrays."""

    def __init__(self, strategy: OneShotHost, partials: PartialWeights) -> None:
        super().__init__(strategy)
        self.partials = partials

    def start(self) -> None:
        """Before the clustering step: not clustered, the start model θ0, the layer choice."""
        self.state.clustered = False
        self.state.cluster_start = self.state.theta0
        self.state.references = {}
        self.partials.start()
        self.state.clustering_state = {}

    # ----------------------------------------------------------------- the cut
    def cut(self, X: np.ndarray, max_clusters: int | None = None,
            sample: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
        """Cluster labels of the rows of X at ``lambda`` (number or auto), and what the cut used;
        ``max_clusters`` (default ``max-clusters``) bounds the auto cut's candidates; ``sample`` > 0 (and below the
        number of rows) clusters that many rows and places the rest at the nearest reference."""
        metric, linkage = self.params.distance, self.params.linkage
        threshold = self.params.number_or_none(self.params.lambda_)
        max_clusters = self.params.max_clusters if max_clusters is None else max_clusters
        if 0 < sample < len(X):
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

    def say_cut(self, diagnostics: Diagnostics, labels: np.ndarray, info: dict[str, Any]) -> None:
        """Add to the clustering round's ``decision`` the words on a cut that left one cluster:
        which arrays, the score against the bar, the setting most likely to change it."""
        if len(np.unique(labels)) > 1:
            return
        p = self.params
        said = no_structure_advice(self.state.layer_choice, type(self.host).__name__,
                                   info.get("auto_best_silhouette"),
                                   info.get("auto_required_silhouette", p.auto_min_silhouette
                                            if p.lambda_ == "auto" else None), self.partials.paper_rule)
        diagnostics["decision"] = "; ".join(text for text in (diagnostics.get("decision"), said) if text)

    # ------------------------------------------------------------ the clusters
    def form(self, server_round: int, keys: list[str], X: np.ndarray, labels: np.ndarray, start: Arrays,
             bytes_up: int, info: dict[str, Any], models_from: Arrays | None = None) -> Diagnostics:
        """Make one cluster per label, every model at ``models_from`` (default ``start``, the
        model the rows of X were trained from and newcomers will train); store references
        and the state for the figures; returns the clustering's diagnostics."""
        p = self.params
        first = start if models_from is None else models_from
        cluster_of_label = {int(label): self.host.new_cluster(first) for label in np.unique(labels)}
        for key, label in zip(keys, labels):
            self.state.assignment[key] = cluster_of_label[int(label)]
        # reference = mean of the members' clustering-round partial weights (our choice: the papers leave it open)
        self.state.references = {cluster_of_label[int(label)]: X[labels == label].mean(axis=0)
                                 for label in np.unique(labels)}
        small = len(keys) <= p.matrix_max_clients
        D = distance_matrix(X, p.distance) if small else None
        silhouette = _silhouette(D, labels) if small else None
        # the dendrogram is for figures; with a sampled clustering it would cost O(m²) memory
        Z = (linkage_matrix(X, metric=p.distance, linkage=p.linkage)
             if 1 < len(keys) and (small or "cluster_sample" not in info) else None)
        self.state.clustered = True
        self.state.cluster_start = start
        self.state.clustering_state = {
            "clustering_round": server_round,
            "final_clustering_round": server_round,  # one-shot: the same; the grid's column for every strategy
            "layers": list(self.partials.keys),
            "layer_choice": self.state.layer_choice.record(),
            "distance": p.distance,
            "vectors": "partial weights minus the start model's (L2 distances equal the weights')",
            "linkage_method": p.linkage,
            "lambda": info["lambda"],
            "silhouette": silhouette,
            "client_order": list(keys),
            "labels": [self.state.assignment[key] for key in keys],
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
    def place_newcomers(self, server_round: int, keys: list[str], epsilon: float | None = math.inf) -> Steps:
        """Place each of ``keys`` sampled this round at its nearest cluster reference; one
        farther than ``epsilon`` founds a cluster (inf: never; None: ``place_newcomer``'s
        default from the references). Returns (the keys that replied, their partial weights
        as rows or None, the diagnostics)."""
        keys = self.host.reachable(keys)  # only this round's sampled clients are asked
        if not keys:
            return [], None, {}
        replied, X, bytes_up, diagnostics = yield from self.partials.collect(server_round, keys,
                                                                              self.state.cluster_start)
        diagnostics["newcomer_bytes_up"] = bytes_up
        if X is None:
            return [], None, diagnostics
        placed = NewcomersPlaced([])
        for key, x in zip(replied, X):
            cluster, distance = place_newcomer(x, self.state.references, epsilon=epsilon, metric=self.params.distance)
            founded = cluster is None
            if founded:
                cluster = self.host.new_cluster(self.state.cluster_start)
                self.state.references[cluster] = x.copy()  # later newcomers may join it
            self.state.assignment[key] = cluster
            placed.entries.append({"round": server_round, "client": key, "cluster": cluster,
                                   "distance": float(distance), "new_cluster": founded})
        self.state.newcomer_log.extend(placed.entries)
        self.host.reports.append(placed)
        diagnostics["newcomers_placed"] = len(replied)
        return replied, X, diagnostics

    # ----------------------------------------------------- what the run says
    def one_cluster_reason(self) -> str | None:
        """Why the run ended with one cluster (None when it has more)."""
        p = self.params
        if len(set(self.state.assignment.values())) > 1:
            return None
        if not self.state.clustered:
            return ONE_CLUSTER_REASONS["not_clustered"]
        best = self.state.clustering_state.get("auto_best_silhouette")
        if p.lambda_ == "auto":
            shown = "none (fewer than 3 clients)" if best is None else f"{best:.3f}"
            reference = self.state.clustering_state.get("auto_reference_silhouette")
            noise = "" if reference is None else f", group-free data of this size reaches {reference:.3f}"
            return (f"{ONE_CLUSTER_REASONS['silhouette']} (best silhouette {shown}, "
                    f"auto-min-silhouette {p.auto_min_silhouette}{noise}; compared "
                    f"{', '.join(self.partials.keys)})")
        return f"{ONE_CLUSTER_REASONS['threshold']} (lambda {p.lambda_})"

    def one_cluster_advice(self) -> str | None:
        if not self.state.clustered:
            return "a longer round timeout or more clients (nobody replied to the clustering step)"
        if self.state.layer_choice.scores:
            return "HiCFL or CFL (they compare every round), or a lower auto-min-silhouette if the groups are close"
        return "cluster_layers='auto' (each layer scored) or HiCFL"


def _silhouette(D: np.ndarray, labels: np.ndarray) -> float | None:
    """Silhouette of a partition on precomputed distances; None where undefined (K < 2 or K = m)."""
    k = len(np.unique(labels))
    if not 2 <= k <= len(labels) - 1:
        return None
    return float(silhouette_score(D, labels, metric="precomputed"))
