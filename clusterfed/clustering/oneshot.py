"""The cuts of the one-shot clusterings (FedClust, AdaCFL), as pure functions: rows of
partial weights in, labels and what the cut used out.

- ``threshold_cut``: the dendrogram cut at λ, a number or ``None`` (= auto, the
  best-silhouette cut kept when it reaches ``min_silhouette`` or beats group-free data of
  the same size and shape); optionally a cut of a sample with the rest placed at the
  nearest reference (``cluster_sampled``).
- ``recut_max_clusters``: the most clusters a cut of many small clients may form;
  ``bounded_auto_cut``: the auto cut held to it when its structure only beats group-free data.
- ``tolerant_threshold``: AdaCFL's auto λ, the fewest clusters within a tolerance of the
  best silhouette.
- ``silhouette_or_none``, ``precluster_records``: what the clustering records for figures.
- ``lone_rows``: the clients a cut sets apart alone, when that is all it finds.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from sklearn.metrics import silhouette_score

from .agglomerative import DEFAULT_MAX_CLUSTERS, AutoCut, cluster_auto, cluster_by_threshold, linkage_matrix
from .reproducible import agreement
from .sampled import cluster_sampled


def threshold_cut(X: np.ndarray, threshold: float | None, *, metric: str, linkage: str, min_silhouette: float,
                  reference_draws: int, seed: int, max_clusters: int,
                  sample: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """Cluster labels of the rows of X at λ = ``threshold`` (None: auto), and what the cut
    used; ``max_clusters`` bounds the auto cut's candidates; ``sample`` > 0 (and below the
    number of rows) clusters that many rows and places the rest at the nearest reference."""
    if 0 < sample < len(X):
        result = cluster_sampled(X, sample, seed=seed, metric=metric, linkage=linkage,
                                 threshold="auto" if threshold is None else threshold,
                                 min_silhouette=min_silhouette, max_clusters=max_clusters)
        return result.labels, {"lambda": result.threshold, "auto_best_silhouette": result.silhouette,
                               "cluster_sample": int(sample)}
    if threshold is None:
        auto = cluster_auto(X, metric=metric, linkage=linkage, min_silhouette=min_silhouette,
                            reference_draws=reference_draws, seed=seed, max_clusters=max_clusters)
        # auto_best_silhouette: on the one-cluster fallback, the best score that fell short
        return auto.labels, {"lambda": auto.threshold, "auto_best_silhouette": auto.silhouette,
                             "auto_reference_silhouette": auto.reference, "auto_required_silhouette": auto.required}
    return cluster_by_threshold(X, threshold, metric=metric, linkage=linkage), {"lambda": threshold}


def recut_max_clusters(clients: int, ceiling: int = DEFAULT_MAX_CLUSTERS) -> int:
    """The most clusters a cut of ``clients`` rows of small clients may form: sqrt(clients / 2),
    the rule of thumb for the number of clusters in Mardia, Kent and Bibby, "Multivariate
    Analysis" (1979), at least 2 and at most ``ceiling``. Why: clients holding a few images
    train alike when their labels are alike, so their rows hold tight groups of a few
    clients below the true groups; the group-free reference has no such fine structure, so
    an unbounded best-silhouette cut can pass it with many clusters of two or three clients."""
    return max(2, min(ceiling, int(math.sqrt(clients / 2))))


class BoundedCut(NamedTuple):
    """``bounded_auto_cut``'s answer: the cut taken; the most clusters it was held to (None
    when it was not held); the best cut it replaced (None when not held)."""

    cut: AutoCut
    bound: int | None
    unbounded: AutoCut | None


def bounded_auto_cut(X: np.ndarray, *, metric: str, linkage: str, min_silhouette: float, reference_draws: int,
                     seed: int, max_clusters: int) -> BoundedCut:
    """The auto cut of the rows of X (``cluster_auto``), cut again into at most
    ``recut_max_clusters`` when its best cut has more clusters than that and a silhouette
    below ``min_silhouette`` (it beats only the group-free reference). Why: such structure is
    tight groups of two or three alike clients (small clients, or each client's own data,
    which makes it repeat round after round), which the reference lacks, not the clients'
    groups."""
    def auto_cut(bound: int) -> AutoCut:
        return cluster_auto(X, metric=metric, linkage=linkage, min_silhouette=min_silhouette,
                            reference_draws=reference_draws, seed=seed, max_clusters=bound)

    small_bound = recut_max_clusters(len(X), max_clusters)
    auto = auto_cut(max_clusters)
    if auto.num_clusters > small_bound and auto.silhouette < min_silhouette:
        return BoundedCut(auto_cut(small_bound), small_bound, auto)
    return BoundedCut(auto, None, None)


def tolerant_threshold(X: np.ndarray, *, metric: str, linkage: str, min_silhouette: float, reference_draws: int,
                       seed: int, max_clusters: int, tolerance: float) -> tuple[float, dict[str, Any]]:
    """An auto λ for the rows of X: the fewest clusters whose silhouette is within
    ``tolerance`` (a fraction) of the best cut's; the best cut when it falls short of what
    group-free data reaches (then one cluster). A best cut that beats only the group-free
    reference, not ``min_silhouette``, is bounded at ``recut_max_clusters``. Returns λ and
    what the cut used (``auto_*``)."""
    auto, bound, _ = bounded_auto_cut(X, metric=metric, linkage=linkage, min_silhouette=min_silhouette,
                                      reference_draws=reference_draws, seed=seed, max_clusters=max_clusters)
    info = {"auto_best_silhouette": auto.silhouette, "auto_reference_silhouette": auto.reference,
            "auto_required_silhouette": auto.required, "auto_best_clusters": auto.num_clusters,
            "auto_clusters": auto.num_clusters, "auto_silhouette": auto.silhouette,
            "auto_tolerance": tolerance, "auto_max_clusters": bound}
    if auto.num_clusters < 2:
        return auto.threshold, info
    # Clients of one group spread along their label balance (a digit pair's clients, from
    # mostly one digit to mostly the other) form elongated groups, and the silhouette
    # gains a few hundredths by halving them: a cut that much worse but with fewer
    # clusters describes the clients as well.
    floor = max(auto.silhouette - tolerance * abs(auto.silhouette), auto.required)
    k = min(k for k, score in auto.scores.items() if score >= floor)
    if k == auto.num_clusters:
        return auto.threshold, info
    heights = linkage_matrix(X, metric=metric, linkage=linkage)[:, 2]
    merges = len(X) - k  # merges applied in the cut into k clusters (a threshold-reachable cut)
    info.update(auto_clusters=k, auto_silhouette=float(auto.scores[k]))
    return 0.5 * (float(heights[merges - 1]) + float(heights[merges])), info


def silhouette_or_none(D: np.ndarray, labels: np.ndarray) -> float | None:
    """Silhouette of a partition on precomputed distances; None where undefined (K < 2 or K = m)."""
    k = len(np.unique(labels))
    if not 2 <= k <= len(labels) - 1:
        return None
    return float(silhouette_score(D, labels, metric="precomputed"))


def precluster_records(keys: list[str], X: np.ndarray, pre: np.ndarray, cuts: dict, *, metric: str,
                       linkage: str) -> list[dict[str, Any]]:
    """Each pre-cluster's clients, λ, silhouette and (for the dendrograms) own linkage."""
    records = []
    for pid in sorted(cuts):
        rows = np.flatnonzero(pre == pid)
        records.append({
            "precluster": int(pid),
            "clients": [keys[i] for i in rows],
            "lambda": float(cuts[pid].threshold),
            "silhouette": cuts[pid].silhouette,
            "linkage": linkage_matrix(X[rows], metric=metric, linkage=linkage).tolist() if len(rows) > 1 else None,
        })
    return records


# ------------------------------------------------- reproducible decisions and revisits
def chain_halves(first: np.ndarray, middle: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent rows per client from a chain of requests: what requests 1..h changed
    (``middle - first``) and what requests h+1..k changed (``last - middle``). Each half is
    its own SGD draws from its own start: a partition both halves show is not one draw's luck."""
    return np.asarray(middle, np.float64) - first, np.asarray(last, np.float64) - middle


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of the mean rows of ``a`` and ``b`` (two clusters' mean updates); 0 when either is zero."""
    x, y = np.asarray(a, np.float64).mean(axis=0), np.asarray(b, np.float64).mean(axis=0)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return 0.0 if norm == 0 else float(x @ y / norm)


def part_separation(X: np.ndarray, labels: np.ndarray) -> float:
    """The smallest distance between two parts' mean rows (0.0 with fewer than two parts):
    how far apart the weakest-separated pair of a cut's parts pulls the model."""
    found = np.unique(labels)
    means = [np.asarray(X, np.float64)[labels == label].mean(axis=0) for label in found]
    gaps = [float(np.linalg.norm(a - b)) for i, a in enumerate(means) for b in means[i + 1:]]
    return min(gaps) if gaps else 0.0


def cut_into(X: np.ndarray, k: int, *, metric: str, linkage: str) -> np.ndarray:
    """The rows of X cut into ``k`` clusters on their dendrogram (the same linkage and
    distance as the decision): a half of the evidence asked for the partition the decision
    took, so that two halves agree when that partition is there in both, whatever finer
    cut each half's silhouette would favour."""
    from scipy.cluster.hierarchy import fcluster

    if len(X) <= k or k < 2:
        return np.arange(len(X)) if len(X) <= k else np.zeros(len(X), dtype=np.int64)
    return fcluster(linkage_matrix(X, metric=metric, linkage=linkage), t=k, criterion="maxclust") - 1


def most_alike(X: np.ndarray, labels: np.ndarray) -> tuple[float, int, int]:
    """The largest cosine between two clusters' mean rows, and the two labels (-1.0, -1, -1
    with fewer than two clusters). Why: clients of one task share its direction of training
    and differ by their own data's idiosyncrasy, which repeats in every draw of their own data
    (so it reproduces); clusters of them still point alike on average, true groups do not."""
    found = sorted(np.unique(labels))
    best = (-1.0, -1, -1)
    for i, a in enumerate(found):
        for b in found[i + 1:]:
            cosine = mean_cosine(X[labels == a], X[labels == b])
            if cosine > best[0]:
                best = (cosine, int(a), int(b))
    return best


def lone_rows(labels: np.ndarray, within: np.ndarray | None = None) -> list[int]:
    """The rows a cut sets apart alone when that is all it finds: with each cluster of one row
    joined to a cluster of two or more that holds rows of its ``within`` label (AdaCFL's
    label-statistics pre-clusters; default one label), the cut is one cluster or ``within``
    itself. Empty when the cut finds more. Which cluster a row joins cannot change the answer:
    a row with two such clusters leaves its ``within`` label split whichever it joins. Why: one
    client's own data cannot be told from a group of one (an outlier of one task, or the one
    sampled member of a group), so such a cut found no groups."""
    labels = np.asarray(labels).copy()
    within = np.zeros(len(labels), dtype=np.int64) if within is None else np.asarray(within)
    found, counts = np.unique(labels, return_counts=True)
    groups = [label for label, count in zip(found, counts) if count > 1]
    alone = []
    for label in (label for label, count in zip(found, counts) if count == 1):
        row = int(np.flatnonzero(labels == label)[0])
        target = next((g for g in groups if np.any(within[labels == g] == within[row])), None)
        if target is not None:
            labels[row] = target
            alone.append(row)
    if alone and (len(np.unique(labels)) < 2 or agreement(labels, within) == 1.0):
        return alone
    return []
