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


# Rows per block in ``nearest_references``: a (block, d) float64 copy of the rows, 111 MB
# at d = 850, whatever the dtype or storage (e.g. a float32 memory map) of X.
DEFAULT_PLACE_CHUNK_ROWS = 16384


def nearest_references(
    X: np.ndarray, R: np.ndarray, metric: str = "l2", *, chunk_rows: int = DEFAULT_PLACE_CHUNK_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """``nearest_cluster`` for every row of X at once: (index of the nearest row of R,
    distance to it), both of length m. Ties go to the lowest index, as there.

    Why by hand: SciPy's ``cdist`` works pair by pair in one thread, and scikit-learn's
    ``pairwise_distances_argmin_min`` has no cosine zero-vector rule and converts the
    whole of X to float64 first. Here X is read ``chunk_rows`` rows at a time (it may be a
    float32 array or a memory map far larger than memory allows in float64), each block
    checked for finite values and compared with R by one matrix product:
    L2 via ‖x − r‖² = ‖x‖² − 2x·r + ‖r‖² (centred on the mean of R, clipped at 0),
    cosine via 1 − x̂·r̂ (a zero row or reference is at distance 1 from everything).
    Distances agree with ``distances_to`` to rounding: L2 within 1e-6 × the largest norm of
    a row about the references' mean (worst near distance 0), cosine within 1e-12; so only
    rows almost equidistant from two references can be placed differently.
    Cost: O(m·K·d) time, O(chunk_rows·(d + K)) memory besides the outputs.
    """
    check_metric(metric)
    R = as_client_matrix(R)
    X = X if isinstance(X, np.ndarray) else np.asarray(X)  # a memory map stays one
    if X.ndim != 2 or X.shape[1] != R.shape[1]:
        raise ValueError(f"rows of shape {X.shape} cannot be compared with references of shape {R.shape}")
    chunk_rows = int(chunk_rows)
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    m = X.shape[0]
    nearest = np.empty(m, dtype=np.int64)
    dist = np.empty(m, dtype=np.float64)
    if metric == "l2":
        centre = R.mean(axis=0)
        Rc = R - centre
        r_sq = np.einsum("ij,ij->i", Rc, Rc)
    else:
        r_norms = np.linalg.norm(R, axis=1)
        Rc = R / np.where(r_norms > 0, r_norms, 1.0)[:, None]
    for start in range(0, m, chunk_rows):
        block = np.array(X[start : start + chunk_rows], dtype=np.float64)
        if not np.all(np.isfinite(block)):
            raise ValueError("partial weights contain NaN or infinite values")
        if metric == "l2":
            block -= centre
            D = block @ Rc.T
            D *= -2.0
            D += r_sq[None, :]
            D += np.einsum("ij,ij->i", block, block)[:, None]
            np.maximum(D, 0.0, out=D)
        else:
            norms = np.linalg.norm(block, axis=1)
            block /= np.where(norms > 0, norms, 1.0)[:, None]
            D = 1.0 - block @ Rc.T
            np.clip(D, 0.0, 2.0, out=D)
        best = np.argmin(D, axis=1)  # first minimum = lowest index
        nearest[start : start + block.shape[0]] = best
        dist[start : start + block.shape[0]] = D[np.arange(best.size), best]
    if metric == "l2":
        np.sqrt(dist, out=dist)
    return nearest, dist
