"""Newcomer placement (FedClust Alg. 2, AdaCFL Alg. 2).

A client without an assignment trains θ0 like in the clustering round and uploads its
partial weights; it joins the cluster whose reference is nearest. AdaCFL also lets it
found a new cluster when even the nearest reference is farther than ε.
"""

from __future__ import annotations

import math

import numpy as np

from .distances import as_client_matrix, check_metric, distances_to, pairwise_distances


def cluster_references(X: np.ndarray, labels: np.ndarray) -> dict[int, np.ndarray]:
    """Reference per cluster: the mean of its members' partial weights (rows of X)."""
    X = as_client_matrix(X)
    labels = np.asarray(labels).ravel()
    if labels.size != X.shape[0]:
        raise ValueError(f"{labels.size} labels for {X.shape[0]} clients")
    return {int(g): X[labels == g].mean(axis=0) for g in np.unique(labels)}


def _ref_matrix(refs: dict[int, np.ndarray]) -> tuple[list[int], np.ndarray]:
    ids = sorted(refs)
    return ids, np.vstack([np.asarray(refs[g], dtype=np.float64).ravel() for g in ids])


def nearest_cluster(x: np.ndarray, refs: dict[int, np.ndarray], metric: str = "l2") -> tuple[int, float]:
    """(cluster id, distance) of the reference nearest to x; ties go to the lowest id."""
    check_metric(metric)
    if not refs:
        raise ValueError("no cluster references to compare with")
    ids, R = _ref_matrix(refs)
    dist = distances_to(x, R, metric)
    best = int(np.argmin(dist))  # first minimum = lowest id (ids are sorted)
    return ids[best], float(dist[best])


def default_epsilon(refs: dict[int, np.ndarray], metric: str = "l2") -> float:
    """AdaCFL's default ε: the largest distance between two cluster references.
    With fewer than two references there is no spread to measure: ε = inf (never found
    a new cluster on distance alone)."""
    check_metric(metric)
    if len(refs) < 2:
        return math.inf
    _, R = _ref_matrix(refs)
    return float(pairwise_distances(R, metric).max())


def place_newcomer(
    x: np.ndarray, refs: dict[int, np.ndarray], *, epsilon: float | None = None, metric: str = "l2"
) -> tuple[int | None, float]:
    """(cluster id, distance) for a newcomer, or (None, distance) when it founds a new
    cluster because the nearest reference is farther than ε (AdaCFL). ε = None uses
    ``default_epsilon``; ε = inf never founds one (FedClust). No references at all:
    (None, inf) — the newcomer is the first cluster."""
    if not refs:
        return None, math.inf
    cluster_id, dist = nearest_cluster(x, refs, metric)
    eps = default_epsilon(refs, metric) if epsilon is None else float(epsilon)
    if dist > eps:
        return None, dist
    return cluster_id, dist
