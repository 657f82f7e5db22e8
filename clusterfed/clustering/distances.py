"""Partial weights -> vectors -> pairwise distances.

Clients upload the arrays of the selected layer(s) (the *partial weights* θ̂); the server
flattens each client's arrays into one row and compares rows with an L2 or cosine distance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.spatial.distance import cdist, pdist, squareform

METRICS = ("l2", "cosine")

# Our metric names -> SciPy's.
_SCIPY_METRIC = {"l2": "euclidean", "cosine": "cosine"}


def check_metric(metric: str) -> str:
    if metric not in _SCIPY_METRIC:
        raise ValueError(f"unknown distance metric {metric!r}; expected one of {METRICS}")
    return metric


def flatten_partial(arrays: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> np.ndarray:
    """One client's partial weights as a 1-D float64 vector.

    Arrays are concatenated in the order given (a mapping: its iteration order, which for a
    state dict is the model's layer order) so that every client's vector lines up.
    """
    values = list(arrays.values()) if isinstance(arrays, Mapping) else list(arrays)
    if not values:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in values])


def stack_partials(partials: Sequence[Sequence[np.ndarray] | Mapping[str, np.ndarray]]) -> np.ndarray:
    """Rows = clients, columns = flattened partial weights: an (m, d) float64 matrix."""
    rows = [flatten_partial(p) for p in partials]
    if not rows:
        raise ValueError("no partial weights to stack")
    sizes = {r.size for r in rows}
    if len(sizes) != 1:
        raise ValueError(f"clients' partial weights differ in size: {sorted(sizes)}")
    return np.vstack(rows)


def as_client_matrix(X: np.ndarray) -> np.ndarray:
    """Validate an (m, d) client matrix: 2-D, at least one client, finite values."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"expected an (m, d) matrix of client vectors, got shape {X.shape}")
    if X.shape[0] == 0:
        raise ValueError("no clients to cluster")
    if not np.all(np.isfinite(X)):
        raise ValueError("partial weights contain NaN or infinite values")
    return X


def _zero_rows(X: np.ndarray) -> np.ndarray:
    return np.flatnonzero(~np.any(X != 0.0, axis=1))


def pairwise_distances(X: np.ndarray, metric: str = "l2") -> np.ndarray:
    """Condensed pairwise distance vector (length m(m-1)/2, ``pdist`` order).

    Cosine distance involving an all-zero vector is undefined (SciPy returns NaN); it is
    set to 1, i.e. similarity 0, as scikit-learn's ``cosine_distances`` does. A zero
    update carries no direction, so it is treated as unrelated to everything, including
    another zero vector.
    """
    check_metric(metric)
    X = as_client_matrix(X)
    m = X.shape[0]
    if m < 2:
        return np.zeros(0, dtype=np.float64)
    if metric == "l2":
        return pdist(X, "euclidean")
    zero = _zero_rows(X)
    if zero.size:
        X = X.copy()
        X[zero] = 1.0  # placeholder so pdist stays NaN-free; overwritten below
    d = pdist(X, "cosine")
    if zero.size:
        i, j = _pairs_touching(m, zero)
        d[condensed_index(m, i, j)] = 1.0
    # Rounding can leave tiny negatives (or values just above 2); linkage wants >= 0.
    np.clip(d, 0.0, 2.0, out=d)
    return d


def _pairs_touching(m: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs (i < j) with i or j in ``rows`` (avoids materialising all m² pairs)."""
    others = np.arange(m)
    i = np.repeat(rows, m)
    j = np.tile(others, rows.size)
    keep = i != j
    i, j = i[keep], j[keep]
    return np.minimum(i, j), np.maximum(i, j)


def condensed_index(m: int, i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray | int:
    """Index into a ``pdist`` vector of pair (i, j), i < j."""
    return m * i - (i * (i + 1)) // 2 + (j - i - 1)


def distance_matrix(X: np.ndarray, metric: str = "l2") -> np.ndarray:
    """Square symmetric (m, m) distance matrix with a zero diagonal."""
    X = as_client_matrix(X)
    if X.shape[0] == 1:
        return np.zeros((1, 1))
    return squareform(pairwise_distances(X, metric), checks=False)


def distances_to(x: np.ndarray, Y: np.ndarray, metric: str = "l2") -> np.ndarray:
    """Distances from one vector ``x`` to every row of ``Y`` (same zero-vector rule)."""
    check_metric(metric)
    x = np.asarray(x, dtype=np.float64).ravel()
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[1] != x.size:
        raise ValueError(f"vector of size {x.size} cannot be compared with rows of shape {Y.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(Y))):
        raise ValueError("partial weights contain NaN or infinite values")
    if metric == "l2":
        return cdist(x[None, :], Y, "euclidean")[0]
    x_zero = not np.any(x != 0.0)
    y_zero = ~np.any(Y != 0.0, axis=1)
    if x_zero:
        return np.ones(Y.shape[0])
    Ysafe = Y.copy()
    Ysafe[y_zero] = 1.0
    d = cdist(x[None, :], Ysafe, "cosine")[0]
    d[y_zero] = 1.0
    return np.clip(d, 0.0, 2.0)
