"""Two-stage clustering for very many clients: the full method on a random sample, the
newcomer rule for everyone else.

One-shot clustering of m clients needs the m(m-1)/2 pairwise distances: 10,000 clients
take 400 MB and a few seconds, 100,000 would take 40 GB. ``cluster_sampled`` instead
builds the dendrogram of a seeded random sample of n clients (λ threshold or auto-λ,
exactly as ``cluster_by_threshold`` / ``cluster_auto``), takes each cluster's reference as
the mean of its sampled members' vectors (``cluster_references``), and places every other
client in the cluster with the nearest reference, as ``place_newcomer`` does with ε = inf
(FedClust: never found a new cluster). Time O(n²·d + m·K·d), memory O(n²) + the input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .agglomerative import (
    DEFAULT_MAX_CLUSTERS,
    DEFAULT_MIN_SILHOUETTE,
    check_linkage,
    cluster_auto,
    cluster_by_threshold,
    relabel_in_order,
)
from .distances import as_client_matrix, check_distance_method
from .newcomers import DEFAULT_PLACE_CHUNK_ROWS, nearest_references


@dataclass
class SampledClustering:
    """Result of ``cluster_sampled``.

    labels: cluster per row of X (0..K-1, in order of first appearance over the rows).
    sample: sorted indices of the rows clustered with the full method (all rows when
    the sample covers everyone); the other rows were placed. references: (K, d) float64,
    row c = mean of cluster c's sampled members. distances: per row, the distance to its
    cluster's reference (for a placed row, the nearest reference). threshold, silhouette,
    num_clusters, scores: as ``AutoCut`` (for a numeric threshold: that λ, silhouette None,
    no scores), computed on the sample.
    """

    labels: np.ndarray
    sample: np.ndarray
    references: np.ndarray
    distances: np.ndarray
    threshold: float
    silhouette: float | None
    num_clusters: int
    scores: dict[int, float] = field(default_factory=dict)


def cluster_sampled(
    X: np.ndarray,
    sample_size: int,
    *,
    seed: int = 0,
    metric: str = "l2",
    linkage: str = "average",
    threshold: float | str = "auto",
    min_silhouette: float = DEFAULT_MIN_SILHOUETTE,
    max_clusters: int | None = DEFAULT_MAX_CLUSTERS,
    distances: str = "blocked",
    chunk_rows: int = DEFAULT_PLACE_CHUNK_ROWS,
) -> SampledClustering:
    """Cluster a seeded random sample of ``sample_size`` rows of X (m, d) with the full
    method, place the other rows at the nearest cluster reference.

    ``sample_size``: 0, or >= m, clusters every row with the full method (the config value
    ``cluster-sample = 0``): the labels are those of ``cluster_auto`` / ``cluster_by_threshold``
    with the same ``distances`` method. ``threshold``: "auto" (auto-λ with
    ``min_silhouette`` and ``max_clusters``, as ``cluster_auto``) or a number λ (cut height,
    as ``cluster_by_threshold``). ``distances``: "blocked" (default, fast) or "pdist".
    X may be float32 or a memory map: only the sample is copied to float64; the rest is
    read ``chunk_rows`` rows at a time.

    When to use it: when m is too large for m(m-1)/2 distances in memory and time (above
    ~10,000-20,000 clients). A group that holds a fraction p of the clients is absent from
    the sample with probability (1-p)^n ≈ exp(-p·n); it also needs a few sampled members
    to be cut as a cluster of its own. So n ≥ 10/p keeps a group with ~10 sampled members
    (e.g. groups of ≥ 0.1% of the clients: n = 10,000). On well-separated groups above that
    size the result equals the full clustering (ARI 1; measured in
    benchmarks/results/clustering_scale.md). What breaks it: a group too small to be
    sampled (or sampled once or twice) has no cluster of its own and its clients are put
    in the cluster of the nearest reference (documented, not an error: it is the ε = inf
    newcomer rule); with auto-λ the silhouette may also prefer a cut that merges a
    sampled-but-small group. A numeric λ carries over from a full clustering for average,
    complete and ward linkage (heights are averages or spreads, not densities); with
    single linkage a sparser sample merges later, so the same λ gives more clusters.
    """
    check_linkage(linkage, metric)
    check_distance_method(distances)
    X = X if isinstance(X, np.ndarray) else np.asarray(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"expected an (m, d) matrix of client vectors with m >= 1, got shape {X.shape}")
    sample_size = int(sample_size)
    if sample_size < 0:
        raise ValueError(f"sample_size must be >= 0 (0 = every client), got {sample_size}")
    auto = isinstance(threshold, str)
    if auto and threshold != "auto":
        raise ValueError(f"threshold must be a number or 'auto', got {threshold!r}")
    m = X.shape[0]
    sample = _draw_sample(m, sample_size, seed)
    Xs = as_client_matrix(X[sample])
    sample_labels, lam, silhouette, scores = _cluster_sample(
        Xs, threshold, metric=metric, linkage=linkage, min_silhouette=min_silhouette,
        max_clusters=max_clusters, distances=distances,
    )
    references = _cluster_means(Xs, sample_labels)

    if len(sample) == m:
        labels = sample_labels
        dist = _own_distances(Xs, references, labels, metric)
    else:
        labels, dist = nearest_references(X, references, metric, chunk_rows=chunk_rows)
        labels[sample] = sample_labels  # sampled rows keep their dendrogram cluster
        dist[sample] = _own_distances(Xs, references, sample_labels, metric)
    new_labels, references = _number_by_first_appearance(labels, references)
    return SampledClustering(
        labels=new_labels,
        sample=sample,
        references=references,
        distances=dist,
        threshold=float(lam),
        silhouette=silhouette,
        num_clusters=len(references),
        scores=scores,
    )


def _cluster_sample(
    Xs: np.ndarray, threshold: float | str, *, metric: str, linkage: str, min_silhouette: float,
    max_clusters: int | None, distances: str,
) -> tuple[np.ndarray, float, float | None, dict]:
    """(labels, λ, silhouette, scores) of the full method on the sample: auto-λ for "auto",
    else the cut at height ``threshold``."""
    if isinstance(threshold, str):
        cut = cluster_auto(
            Xs, metric=metric, linkage=linkage, min_silhouette=min_silhouette,
            max_clusters=max_clusters, distances=distances,
        )
        return cut.labels, cut.threshold, cut.silhouette, cut.scores
    lam = float(threshold)
    return cluster_by_threshold(Xs, lam, metric=metric, linkage=linkage, distances=distances), lam, None, {}


def _draw_sample(m: int, sample_size: int, seed: int) -> np.ndarray:
    """Sorted positions of the seeded sample of ``sample_size`` of m rows (every row for 0 or >= m)."""
    n = m if sample_size == 0 else min(sample_size, m)
    if n == m:
        return np.arange(m)
    return np.sort(np.random.default_rng(seed).choice(m, size=n, replace=False))


def _cluster_means(Xs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(K, d) mean row of each cluster 0..K-1 of ``labels`` (every cluster has members)."""
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k).astype(np.float64)
    references = np.zeros((k, Xs.shape[1]))
    np.add.at(references, labels, Xs)
    return references / sizes[:, None]


def _number_by_first_appearance(labels: np.ndarray, references: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clusters renumbered in order of first appearance over all rows, references reordered to match."""
    new_labels = relabel_in_order(labels)
    old, first = np.unique(labels, return_index=True)  # all K: each has sampled members
    order = np.empty(len(references), dtype=np.int64)
    order[new_labels[first]] = old
    return new_labels, references[order]


def _own_distances(Xs: np.ndarray, references: np.ndarray, labels: np.ndarray, metric: str) -> np.ndarray:
    """Distance of each row to the reference of its own cluster."""
    R = references[labels]
    if metric == "l2":
        return np.linalg.norm(Xs - R, axis=1)
    xn, rn = np.linalg.norm(Xs, axis=1), np.linalg.norm(R, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = 1.0 - np.einsum("ij,ij->i", Xs, R) / (xn * rn)
    d[(xn == 0) | (rn == 0)] = 1.0
    return np.clip(d, 0.0, 2.0)
