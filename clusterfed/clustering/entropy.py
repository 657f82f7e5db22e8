"""AdaCFL's label statistics and entropy pre-clustering.

Each client reports L_c (number of classes it holds) and s_c (Shannon entropy of its label
histogram). Clients are first grouped by these numbers (pre-clusters), then clustered on
their partial weights inside each pre-cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .agglomerative import (
    DEFAULT_MAX_CLUSTERS,
    DEFAULT_MIN_SILHOUETTE,
    AutoCut,
    check_linkage,
    cluster_auto,
    cluster_by_threshold,
    relabel_in_order,
)
from .distances import as_client_matrix

# NumPy-only, shared with the client (which must import without SciPy)
from clusterfed.label_stats import _counts, label_entropy, num_classes_present  # noqa: E402,F401


def entropy_preclusters(num_classes: Sequence[int], entropies: Sequence[float], gap: float = 0.1) -> np.ndarray:
    """AdaCFL pre-clustering: a pre-cluster id per client (in input order).

    Clients with equal L_c are grouped; inside a group, sorted by s_c, a new pre-cluster
    starts when s_c > first · (1 + gap), ``first`` being the entropy of the current
    pre-cluster's first member. The rule is used literally also when first == 0: then
    any s_c > 0 starts a new pre-cluster. With consistent statistics this case only
    arises for L_c = 1, where every entropy is 0, so such clients stay together.
    Ids are numbered by increasing L_c, then increasing entropy.
    """
    L = np.asarray(num_classes, dtype=np.int64).ravel()
    s = np.asarray(entropies, dtype=np.float64).ravel()
    if L.size != s.size:
        raise ValueError(f"{L.size} class counts but {s.size} entropies")
    if gap < 0 or not np.isfinite(gap):
        raise ValueError(f"entropy gap must be a finite value >= 0, got {gap}")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("entropies must be finite and >= 0")
    pre = np.empty(L.size, dtype=np.int64)
    next_id = 0
    for num in np.unique(L):
        members = np.flatnonzero(L == num)
        members = members[np.argsort(s[members], kind="stable")]  # ties: input order
        first = None
        for c in members:
            if first is None or s[c] > first * (1.0 + gap):
                if first is not None:
                    next_id += 1
                first = s[c]
            pre[c] = next_id
        next_id += 1
    return pre


def cluster_within_preclusters(
    X: np.ndarray,
    pre: np.ndarray,
    threshold_or_auto: float | str,
    *,
    metric: str = "l2",
    linkage: str = "average",
    min_silhouette: float = DEFAULT_MIN_SILHOUETTE,
    max_clusters: int | None = DEFAULT_MAX_CLUSTERS,
    return_cuts: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict[int, AutoCut]]:
    """Agglomerative clustering inside each pre-cluster; final clusters = their union.

    ``threshold_or_auto`` is a λ (float) or ``"auto"`` (``cluster_auto`` per pre-cluster).
    Labels are globally unique, 0..K-1 in order of first appearance. A pre-cluster of one
    client is one cluster. With ``return_cuts`` also returns, per pre-cluster id, the
    cut used (for λ given: that λ, silhouette None) so the λ and score can be reported.
    """
    check_linkage(linkage, metric)
    X = as_client_matrix(X)
    pre = np.asarray(pre).ravel()
    if pre.size != X.shape[0]:
        raise ValueError(f"{pre.size} pre-cluster ids for {X.shape[0]} clients")
    auto = isinstance(threshold_or_auto, str)
    if auto and threshold_or_auto != "auto":
        raise ValueError(f"threshold must be a number or 'auto', got {threshold_or_auto!r}")
    labels = np.empty(X.shape[0], dtype=np.int64)
    cuts: dict[int, AutoCut] = {}
    offset = 0
    for pid in np.unique(pre):
        rows = np.flatnonzero(pre == pid)
        if auto:
            cut = cluster_auto(
                X[rows], metric=metric, linkage=linkage, min_silhouette=min_silhouette, max_clusters=max_clusters
            )
        else:
            local = cluster_by_threshold(X[rows], float(threshold_or_auto), metric=metric, linkage=linkage)
            cut = AutoCut(local, float(threshold_or_auto), None, int(local.max()) + 1)
        labels[rows] = cut.labels + offset
        offset += cut.num_clusters
        cuts[int(pid)] = cut
    labels = relabel_in_order(labels)
    return (labels, cuts) if return_cuts else labels


def merge_across_preclusters(
    X: np.ndarray,
    labels: np.ndarray,
    threshold: float,
    *,
    metric: str = "l2",
    linkage: str = "average",
    chunk_rows: int = 256,
) -> np.ndarray:
    """Continue the agglomeration from the clusters of every pre-cluster: merge the two
    nearest clusters (by ``linkage`` on ``metric``, as the dendrogram measures them) while
    they are at most ``threshold`` apart. AdaCFL's Algorithm 1 runs the hierarchical
    clustering "on" the pre-clusters and merges the nearest clusters "until the distance
    between them is greater than λ"; a plain union of the pre-clusters' cuts would leave two
    clusters closer than λ apart whenever the pre-clustering put one group into several
    pre-clusters. Returns labels 0..K-1 in order of first appearance."""
    check_linkage(linkage, metric)
    X = as_client_matrix(X)
    labels = relabel_in_order(np.asarray(labels).ravel())
    if labels.size != X.shape[0]:
        raise ValueError(f"{labels.size} labels for {X.shape[0]} clients")
    k = int(labels.max()) + 1
    if k < 2:
        return labels
    sizes = np.bincount(labels, minlength=k).astype(np.float64)
    if linkage == "ward":
        centroids = np.stack([X[labels == c].mean(axis=0) for c in range(k)])
        C = _ward_distances(centroids, sizes)
    else:
        C = _cluster_linkage_distances(X, labels, k, metric, linkage, chunk_rows)
    total = C * np.outer(sizes, sizes) if linkage == "average" else None  # sums of member distances
    active = np.ones(k, dtype=bool)
    root = np.arange(k)
    np.fill_diagonal(C, np.inf)
    while active.sum() > 1:
        a, b = np.unravel_index(np.argmin(C), C.shape)
        if not C[a, b] <= threshold:
            break
        a, b = min(a, b), max(a, b)
        if linkage == "average":
            total[a] += total[b]
            total[:, a] = total[a]
            sizes[a] += sizes[b]
            C[a] = total[a] / (sizes[a] * sizes)
        elif linkage == "single":
            C[a] = np.minimum(C[a], C[b])
        elif linkage == "complete":
            C[a] = np.maximum(C[a], C[b])
        else:  # ward: the merged centroid's distances
            centroids[a] = (sizes[a] * centroids[a] + sizes[b] * centroids[b]) / (sizes[a] + sizes[b])
            sizes[a] += sizes[b]
            C[a] = _ward_distances(centroids, sizes, row=a)
        active[b] = False
        root[root == b] = a
        C[b] = C[:, b] = np.inf
        C[a, ~active] = np.inf
        C[:, a] = C[a]
        C[a, a] = np.inf
    return relabel_in_order(root[labels])


def _cluster_linkage_distances(X: np.ndarray, labels: np.ndarray, k: int, metric: str, linkage: str,
                               chunk_rows: int) -> np.ndarray:
    """k × k matrix of the average / smallest / largest member distance between clusters,
    computed in row chunks (never the m × m matrix)."""
    from scipy.spatial.distance import cdist

    reduce = {"average": np.add, "single": np.minimum, "complete": np.maximum}[linkage]
    start = 0.0 if linkage == "average" else (np.inf if linkage == "single" else -np.inf)
    out = np.full((k, k), start)
    for lo in range(0, X.shape[0], chunk_rows):
        rows = slice(lo, lo + chunk_rows)
        D = cdist(X[rows], X, "euclidean" if metric == "l2" else "cosine")
        D[np.isnan(D)] = 1.0  # a zero vector has no direction: similarity 0 (pairwise_distances' rule)
        for c in range(k):
            cols = D[:, labels == c]
            if linkage == "average":
                part = np.bincount(labels[rows], weights=cols.sum(axis=1), minlength=k)
            else:
                per_row = cols.min(axis=1) if linkage == "single" else cols.max(axis=1)
                part = np.full(k, start)
                reduce.at(part, labels[rows], per_row)
            out[:, c] = reduce(out[:, c], part)
    if linkage == "average":
        sizes = np.bincount(labels, minlength=k).astype(np.float64)
        out /= np.outer(sizes, sizes)
    return out


def _ward_distances(centroids: np.ndarray, sizes: np.ndarray, row: int | None = None) -> np.ndarray:
    """Ward's merge height between clusters (SciPy's: sqrt(2·na·nb/(na+nb))·‖ca − cb‖);
    all pairs, or one ``row``."""
    if row is None:
        diff = np.linalg.norm(centroids[:, None, :] - centroids[None, :, :], axis=2)
        return np.sqrt(2.0 * np.outer(sizes, sizes) / np.add.outer(sizes, sizes)) * diff
    diff = np.linalg.norm(centroids - centroids[row], axis=1)
    return np.sqrt(2.0 * sizes[row] * sizes / (sizes[row] + sizes)) * diff
