"""Agglomerative clustering of client vectors: threshold cut, k cut, and automatic cut.

All three build the same SciPy dendrogram (``linkage`` on condensed distances) and differ
only in where it is cut. ``distances`` picks how the condensed distances are computed:
"pdist" (SciPy, the default) or "blocked" (``blocked_pairwise_distances``: matrix products
on all cores, equal to rounding; ~10x faster for thousands of clients). Labels are always 0..K-1, numbered in order of first appearance
over the rows, so the same partition gives the same labels whatever SciPy's numbering.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.cluster import hierarchy

from .null_reference import ReferenceMethod, reference_score, structure_threshold
from .distances import as_client_matrix, check_distance_method, check_metric, condensed_distances

LINKAGES = ("average", "single", "complete", "ward")

# Default for ``cluster_auto``'s min_silhouette, from measurements on isotropic Gaussian
# noise (the IID case: no groups), best silhouette over all cuts, max over 300 seeds:
# L2, 5-100 clients in 50 dims: <= 0.19; 10-100 clients in 650 dims: <= 0.06; cosine,
# 10-100 clients in 50 dims: <= 0.23. Separated groups score 0.5-0.9. 0.25 keeps IID
# clients in one cluster (FedAvg) and still finds real groups. Caveat: noise concentrated
# in a few directions scores higher (power-law spectrum 1/i over 650 dims: up to 0.29;
# 1/i²: ~0.55), so confirm on real IID updates and raise the value if they split.
DEFAULT_MIN_SILHOUETTE = 0.25

# Default cap on the number of clusters ``cluster_auto`` considers. The search is
# O(m²·K + m·K²) for K candidate cuts, so it must be bounded for thousands of clients; 100
# covers every cut for the papers' populations (≤ 101 clients) and AdaCFL/FedClust-style
# label skew (at most C(10, 2) = 45 label pairs on 10-class data).
DEFAULT_MAX_CLUSTERS = 100


def check_linkage(linkage: str, metric: str) -> None:
    check_metric(metric)
    if linkage not in LINKAGES:
        raise ValueError(f"unknown linkage {linkage!r}; expected one of {LINKAGES}")
    if linkage == "ward" and metric != "l2":
        # Ward's update formula assumes Euclidean distances.
        raise ValueError("ward linkage requires metric='l2'")


def relabel_in_order(labels: np.ndarray) -> np.ndarray:
    """Renumber labels 0..K-1 in order of first appearance."""
    labels = np.asarray(labels)
    _, first_index, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first_index.size, dtype=np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(first_index.size)
    return rank[inverse.ravel()]


def linkage_matrix(
    X: np.ndarray, *, metric: str = "l2", linkage: str = "average", distances: str = "pdist"
) -> np.ndarray:
    """SciPy linkage matrix Z (m-1, 4) of the client vectors (needs m >= 2)."""
    check_linkage(linkage, metric)
    check_distance_method(distances)
    X = as_client_matrix(X)
    if X.shape[0] < 2:
        raise ValueError("a dendrogram needs at least two clients")
    return _linkage_from_condensed(condensed_distances(X, metric, distances), linkage)


def _linkage_from_condensed(d: np.ndarray, linkage: str) -> np.ndarray:
    # checks off: pdist output is already a valid finite condensed vector.
    return hierarchy.linkage(d, method=linkage, optimal_ordering=False)


def cluster_by_threshold(
    X: np.ndarray, threshold: float, *, metric: str = "l2", linkage: str = "average", distances: str = "pdist"
) -> np.ndarray:
    """Cut the dendrogram at height λ = ``threshold``: merges at height <= λ are kept."""
    check_linkage(linkage, metric)
    check_distance_method(distances)
    X = as_client_matrix(X)
    threshold = float(threshold)
    if np.isnan(threshold):
        raise ValueError("threshold is NaN")
    if X.shape[0] == 1:
        return np.zeros(1, dtype=np.int64)
    Z = linkage_matrix(X, metric=metric, linkage=linkage, distances=distances)
    return relabel_in_order(hierarchy.fcluster(Z, t=threshold, criterion="distance"))


def cluster_into_k(
    X: np.ndarray, k: int, *, metric: str = "l2", linkage: str = "average", distances: str = "pdist"
) -> np.ndarray:
    """Cut the dendrogram into ``k`` clusters (k clipped to [1, m]).

    With tied merge heights SciPy may return fewer than k clusters (it never splits a tie).
    """
    check_linkage(linkage, metric)
    check_distance_method(distances)
    X = as_client_matrix(X)
    m = X.shape[0]
    k = int(min(max(int(k), 1), m))
    if m == 1:
        return np.zeros(1, dtype=np.int64)
    Z = linkage_matrix(X, metric=metric, linkage=linkage, distances=distances)
    return relabel_in_order(hierarchy.fcluster(Z, t=k, criterion="maxclust"))


@dataclass
class AutoCut:
    """Result of ``cluster_auto``.

    labels: cluster per client (0..K-1). threshold: a λ such that
    ``cluster_by_threshold(X, λ)`` gives the same labels. silhouette: the best silhouette
    score over the candidate cuts — the score of the returned partition when it has >= 2
    clusters; on the one-cluster fallback, the best score that failed to reach
    ``min_silhouette`` (None when there was no candidate cut, e.g. m < 3).
    scores: silhouette per candidate number of clusters (for logs and plots).
    reference: the best silhouette of the no-group reference data sets
    (``null_reference``), when they were drawn; required: the silhouette the best cut
    had to reach.
    """

    labels: np.ndarray
    threshold: float
    silhouette: float | None
    num_clusters: int
    scores: dict[int, float] = field(default_factory=dict)
    reference: float | None = None
    required: float | None = None


def _one_cluster_threshold(heights: np.ndarray) -> float:
    top = float(heights[-1]) if heights.size else 0.0
    # Any λ >= top merge height gives one cluster; 2·top keeps a visible margin.
    return 2.0 * top if top > 0 else 1.0


def cluster_auto(
    X: np.ndarray,
    *,
    metric: str = "l2",
    linkage: str = "average",
    min_silhouette: float = DEFAULT_MIN_SILHOUETTE,
    max_clusters: int | None = DEFAULT_MAX_CLUSTERS,
    distances: str = "pdist",
    reference_draws: int = 0,
    seed: int = 0,
    reference_method: ReferenceMethod = "rotation",
) -> AutoCut:
    """λ = "auto": the dendrogram cut with the best silhouette, or one cluster.

    Candidates are the cuts into 2..min(m-1, max_clusters) clusters that a threshold can
    produce (a cut between two equal merge heights cannot, and is skipped). λ is the
    midpoint between the two merge heights that bound the chosen cut. Ties in score go to
    fewer clusters. If the best score is below ``min_silhouette`` — no structure, e.g. IID
    clients — every client goes to one cluster. ``max_clusters=None`` considers all cuts.

    ``reference_draws > 0``: when the best score falls short of ``min_silhouette``, the
    threshold is lowered to the best score that the same procedure reaches on that many
    group-free data sets shaped like X (``null_reference``; ``reference_method``: X's rows
    rotated about their mean, exact for Gaussian noise of any covariance, or Gaussian draws
    with X's covariance): many small, noisy clients hold real groups whose silhouette is
    below a threshold fit for tens of clients, and so do a few clients whose updates have
    thousands of coordinates; noise of that size and shape scores lower still. A cut that
    passes ``min_silhouette`` is never affected.
    """
    check_linkage(linkage, metric)
    check_distance_method(distances)
    X = as_client_matrix(X)
    m = X.shape[0]
    if m < 3:
        # Silhouette is defined for 2..m-1 clusters only: nothing to choose from.
        heights = linkage_matrix(X, metric=metric, linkage=linkage, distances=distances)[:, 2] if m == 2 else np.zeros(0)
        threshold = _one_cluster_threshold(heights) if m == 2 else 0.0
        return AutoCut(np.zeros(m, dtype=np.int64), threshold, None, 1)

    d = condensed_distances(X, metric, distances)
    Z = _linkage_from_condensed(d, linkage)
    heights = Z[:, 2]
    k_max = m - 1 if max_clusters is None else min(m - 1, int(max_clusters))
    scores, labels_of = _silhouettes_of_cuts(d, Z, m, k_max)
    if scores:
        best_score = max(scores.values())
        best_k = min(k for k, s in scores.items() if s == best_score)
    reference, required = None, min_silhouette
    if scores and best_score < min_silhouette and reference_draws > 0:
        def score(R: np.ndarray) -> float | None:
            return cluster_auto(R, metric=metric, linkage=linkage, min_silhouette=-1.0,
                                max_clusters=max_clusters, distances=distances).silhouette
        reference = reference_score(X, score, draws=reference_draws, seed=seed, method=reference_method)
        required = structure_threshold(min_silhouette, reference)
    if not scores or best_score < required:
        return AutoCut(
            np.zeros(m, dtype=np.int64),
            _one_cluster_threshold(heights),
            best_score if scores else None,
            1,
            scores,
            reference,
            required,
        )
    merges = m - best_k  # merges 0..merges-1 are applied in this cut
    threshold = 0.5 * (float(heights[merges - 1]) + float(heights[merges]))
    return AutoCut(relabel_in_order(labels_of[best_k]), threshold, float(best_score), best_k, scores,
                   reference, required)


def _leaf_roots(Z: np.ndarray, m: int, merges: int) -> np.ndarray:
    """Root node id of every leaf after applying the first ``merges`` merges of Z."""
    parent = np.arange(2 * m - 1)
    if merges:
        children = Z[:merges, :2].astype(np.int64)
        new_nodes = m + np.arange(merges)
        parent[children[:, 0]] = new_nodes
        parent[children[:, 1]] = new_nodes
    # Pointer jumping: O(m log depth) instead of walking each leaf up the tree.
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            break
        parent = grand
    return parent[:m]


def _cluster_distance_sums(d: np.ndarray, m: int, labels: np.ndarray, k: int) -> np.ndarray:
    """S[i, c] = sum of distances from client i to the members of cluster c, in one pass
    over the condensed vector (never materialising the m×m matrix).

    Row i of the condensed vector holds D[i, i+1:]: it adds to S[i, ·] by the labels of
    clients i+1.. (``bincount``) and, by symmetry, to S[i+1:, labels[i]].
    """
    St = np.zeros((k, m))  # transposed so that the symmetric half is a contiguous add
    start = 0
    for i in range(m - 1):
        seg = d[start : start + m - i - 1]
        start += m - i - 1
        St[:, i] += np.bincount(labels[i + 1 :], weights=seg, minlength=k)
        St[labels[i], i + 1 :] += seg
    return np.ascontiguousarray(St.T)


def _silhouettes_of_cuts(
    d: np.ndarray, Z: np.ndarray, m: int, k_max: int, chunk_rows: int | None = None
) -> tuple[dict[int, float], dict[int, np.ndarray]]:
    """Silhouette score (as ``sklearn.metrics.silhouette_score`` with precomputed
    distances) of every threshold-reachable cut into 2..k_max clusters.

    Computed incrementally instead of calling scikit-learn once per cut (O(m²) each):
    S[i, c] = sum of distances from client i to the members of cluster c is built once for
    the k_max cut (one pass over the condensed vector), then each dendrogram
    merge adds two columns. Each cut's score then costs O(m·k).
    Returns the scores and the labels of each scored cut. ``chunk_rows`` is no longer
    used (the sums need no chunking); it is accepted so that existing callers keep working.
    """
    scores: dict[int, float] = {}
    labels_of: dict[int, np.ndarray] = {}
    if k_max < 2:
        return scores, labels_of
    heights = Z[:, 2]
    first = m - k_max  # merges applied in the starting cut
    roots = _leaf_roots(Z, m, first)
    root_ids, labels = np.unique(roots, return_inverse=True)
    labels = labels.ravel().astype(np.int64)
    k = root_ids.size  # == k_max
    col_of_node = {int(node): c for c, node in enumerate(root_ids)}
    node_of_col = [int(node) for node in root_ids]
    sizes = np.bincount(labels, minlength=k).astype(np.float64)

    S = _cluster_distance_sums(d, m, labels, k)
    all_rows = np.arange(m)

    for t in range(first, m - 1):
        # Current cut has k = m - t clusters, reachable iff heights[t-1] < heights[t].
        if k >= 2 and heights[t - 1] < heights[t]:
            scores[k] = _silhouette_from_sums(S[:, :k], sizes[:k], labels, all_rows)
            labels_of[k] = labels.copy()
        if k == 2:
            break
        a, b = int(Z[t, 0]), int(Z[t, 1])
        ca, cb = col_of_node.pop(a), col_of_node.pop(b)
        keep, gone = min(ca, cb), max(ca, cb)
        S[:, keep] += S[:, gone]
        sizes[keep] += sizes[gone]
        labels[labels == gone] = keep
        col_of_node[m + t] = keep
        node_of_col[keep] = m + t
        last = k - 1
        if gone != last:  # swap-remove: keep the active columns contiguous
            S[:, gone] = S[:, last]
            sizes[gone] = sizes[last]
            labels[labels == last] = gone
            moved = node_of_col[last]
            col_of_node[moved] = gone
            node_of_col[gone] = moved
        node_of_col.pop()
        k -= 1
    return scores, labels_of


def _silhouette_from_sums(S: np.ndarray, sizes: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> float:
    own_size = sizes[labels]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = S[rows, labels] / (own_size - 1.0)
        means = S / sizes
    means[rows, labels] = np.inf
    b = means.min(axis=1)
    denom = np.maximum(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (b - a) / denom
    # Singletons score 0 (scikit-learn's convention), as does a zero denominator.
    s[(own_size <= 1) | ~np.isfinite(s)] = 0.0
    return float(s.mean())


def labels_with_keys(keys: Sequence[Hashable], labels: np.ndarray) -> dict[Hashable, int]:
    """Map client keys (in row order) to their cluster labels."""
    labels = np.asarray(labels)
    if len(keys) != labels.size:
        raise ValueError(f"{len(keys)} keys but {labels.size} labels")
    return {key: int(label) for key, label in zip(keys, labels.ravel())}
