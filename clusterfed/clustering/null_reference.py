"""How well does noise cluster? A reference for silhouette thresholds that scales with the
number of clients.

A fixed silhouette threshold (0.25, 0.3) separates structure from noise for tens of
clients, but the best silhouette that noise reaches falls with the number of clients while
the silhouette of real groups of small, noisy clients falls too: hundreds of clients with a
few dozen samples each hold real groups whose silhouette is well below a threshold chosen at
20 clients. The reference here is the idea of Tibshirani, Walther and Hastie's gap statistic
("Estimating the number of clusters in a data set via the gap statistic", JRSS-B 2001) with
their principal-component reference: draw data sets with no groups — Gaussian, with the
clients' own mean and covariance — score each with the same clustering procedure, and take
a high quantile of those scores as "what noise reaches at this size and shape".

scikit-learn and SciPy have the clustering and the silhouette but no reference
distribution, so the draw is written here. The rows are first expressed in an orthonormal
basis of their span (an m × min(m, d) matrix), which keeps every L2 and cosine distance and
makes a draw cost O(m³) instead of O(m²·d).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

# Quantile of the reference scores a structured data set must beat; with 19 draws the
# largest one (a one-sided 5 % test).
DEFAULT_DRAWS = 19
# Above this many rows the reference uses a seeded subsample of rows: noise scores fall
# with the number of rows, so this only makes the reference stricter, never looser.
MAX_REFERENCE_ROWS = 600


def span_coordinates(X: np.ndarray) -> np.ndarray:
    """The rows of X in an orthonormal basis of their span: same pairwise L2 distances,
    dot products and norms (so same cosines), at most m columns."""
    X = np.asarray(X, dtype=np.float64)
    m, d = X.shape
    if d <= m:
        return X
    q, r = np.linalg.qr(X.T)  # X.T = q r, q: d×m orthonormal columns
    return r.T  # X = r.T q.T, so r.T holds the coordinates of each row


def reference_draws(X: np.ndarray, draws: int, seed: int, max_rows: int = MAX_REFERENCE_ROWS) -> list[np.ndarray]:
    """``draws`` Gaussian data sets with X's row count (capped at ``max_rows``), mean and
    covariance, and no groups."""
    rng = np.random.default_rng(seed)
    X = np.asarray(X, dtype=np.float64)
    if len(X) > max_rows:
        X = X[np.sort(rng.choice(len(X), size=max_rows, replace=False))]
    C = span_coordinates(X)
    mean = C.mean(axis=0)
    centred = C - mean
    m = len(C)
    scale = 1.0 / np.sqrt(max(m - 1, 1))
    return [mean + (rng.standard_normal((m, m)) * scale) @ centred for _ in range(int(draws))]


def reference_score(X: np.ndarray, score: Callable[[np.ndarray], float | None], *, draws: int = DEFAULT_DRAWS,
                    seed: int = 0, max_rows: int = MAX_REFERENCE_ROWS) -> float | None:
    """The largest ``score`` over ``draws`` reference data sets shaped like X (None when no
    draw could be scored, e.g. fewer than 3 rows). ``score`` maps a row matrix to the best
    silhouette the clustering procedure finds in it."""
    if draws <= 0 or len(X) < 3:
        return None
    scores = [s for s in (score(R) for R in reference_draws(X, draws, seed, max_rows)) if s is not None]
    return max(scores) if scores else None


def structure_threshold(fixed: float, reference: float | None) -> float:
    """The silhouette a cut must reach: the fixed threshold, lowered to what noise of this
    size reaches when that is less. Never raised above ``fixed``, so every cut accepted
    with the fixed threshold alone is still accepted."""
    return fixed if reference is None else min(fixed, reference)
