"""How well does noise cluster? A reference for silhouette thresholds that scales with the
number of clients.

A fixed silhouette threshold (0.25, 0.3) separates structure from noise for tens of
clients, but the best silhouette that noise reaches falls with the number of clients while
the silhouette of real groups of small, noisy clients falls too: hundreds of clients with a
few dozen samples each hold real groups whose silhouette is well below a threshold chosen at
20 clients. The reference here is the idea of Tibshirani, Walther and Hastie's gap statistic
("Estimating the number of clusters in a data set via the gap statistic", JRSS-B 2001):
draw data sets with no groups shaped like the clients' rows, score each with the same
clustering procedure, and take the largest of ``draws`` scores as "what noise reaches at
this size and shape" (with 19 draws, a one-sided 5 % Monte Carlo test).

Two ways to draw them (``method``):

- ``"gaussian"``: their principal-component reference, Gaussian rows with the rows' mean
  and covariance. With m rows the covariance has rank m - 1, so the draws live in m - 1
  dimensions; a few clients' update vectors live in thousands, where noise makes every
  pairwise distance nearly the same (the rows form a near-regular simplex: Hall, Marron and
  Neeman, "Geometric representation of high dimension, low sample size data", JRSS-B 2005).
  Gaussian points in m - 1 dimensions clump by chance far more, so at 6-16 clients this
  reference scores high (0.5-0.75) and can never lower the fixed threshold.
- ``"rotation"``: a rotation test (Langsrud, "Rotation tests", Statistics and Computing
  2005): the rows' deviations from their mean are mixed by a random orthogonal matrix that
  keeps the all-ones direction (Haar on its complement). For rows that are i.i.d. Gaussian
  with any mean and any covariance the rotated sets have the data's own distribution, so
  the test is exact whatever the spread of the noise across directions, and nothing is
  estimated; every rotated set keeps the data's Gram spectrum, hence its distance
  concentration. Group means are mixed into Gaussian-like spreads, which is what the
  clustering has to beat.

scikit-learn and SciPy have the clustering and the silhouette but neither reference, so the
draws are written here. The rows are first expressed in an orthonormal basis of their span
(an m × min(m, d) matrix), which keeps every L2 and cosine distance and makes a draw cost
O(m³) instead of O(m²·d).
"""

from __future__ import annotations

from typing import Callable, Literal

import numpy as np

ReferenceMethod = Literal["gaussian", "rotation"]
REFERENCE_METHODS = ("gaussian", "rotation")

# Quantile of the reference scores a structured data set must beat; with 19 draws the
# largest one (a one-sided 5 % test).
DEFAULT_DRAWS = 19
# Above this many rows the reference uses a seeded subsample of rows: noise scores fall
# with the number of rows, so this only makes the reference stricter, never looser.
MAX_REFERENCE_ROWS = 600


def shared_draws(draws: int, tests: int) -> int:
    """The rotations one of ``tests`` tests must beat for all of them together to pass
    group-free rows as rarely as one test of ``draws`` does (Bonferroni: a test beating the
    largest of ``draws`` passes one time in ``draws + 1``)."""
    return draws if tests <= 1 or draws <= 0 else tests * (draws + 1) - 1


def span_coordinates(X: np.ndarray) -> np.ndarray:
    """The rows of X in an orthonormal basis of their span: same pairwise L2 distances,
    dot products and norms (so same cosines), at most m columns."""
    X = np.asarray(X, dtype=np.float64)
    m, d = X.shape
    if d <= m:
        return X
    q, r = np.linalg.qr(X.T)  # X.T = q r, q: d×m orthonormal columns
    return r.T  # X = r.T q.T, so r.T holds the coordinates of each row


def sampled_rows(rows: int, max_rows: int, rng: np.random.Generator) -> np.ndarray | None:
    """The sorted indices of ``max_rows`` of ``rows`` rows drawn from ``rng``; None when
    there are no more rows than that (all are kept)."""
    return np.sort(rng.choice(rows, size=max_rows, replace=False)) if rows > max_rows else None


def reference_draws(X: np.ndarray, draws: int, seed: int, max_rows: int = MAX_REFERENCE_ROWS,
                    method: ReferenceMethod = "gaussian") -> list[np.ndarray]:
    """``draws`` data sets with X's row count (capped at ``max_rows``) and no groups:
    Gaussian with X's mean and covariance (``"gaussian"``), or X's rows rotated about their
    mean (``"rotation"``)."""
    if method not in REFERENCE_METHODS:
        raise ValueError(f"unknown reference method {method!r}; expected one of {REFERENCE_METHODS}")
    rng = np.random.default_rng(seed)
    X = np.asarray(X, dtype=np.float64)
    kept = sampled_rows(len(X), max_rows, rng)
    if kept is not None:
        X = X[kept]
    C = span_coordinates(X)
    m = len(C)
    mean = C.mean(axis=0)
    if method == "rotation":
        # the deviations in an orthonormal basis of the complement of the ones vector, then
        # rotated there: mean + basis · haar · basisᵀ · (C - mean), O(m³) per draw
        basis = complement_of_ones(m)
        deviations = basis.T @ (C - mean)
        return [mean + basis @ (haar_orthogonal(m - 1, rng) @ deviations) for _ in range(int(draws))]
    centred = C - mean
    scale = 1.0 / np.sqrt(max(m - 1, 1))
    return [mean + (rng.standard_normal((m, m)) * scale) @ centred for _ in range(int(draws))]


def complement_of_ones(m: int) -> np.ndarray:
    """An m × (m - 1) orthonormal basis of the vectors orthogonal to the all-ones vector."""
    q, _ = np.linalg.qr(np.hstack([np.ones((m, 1)), np.eye(m)[:, : m - 1]]))
    return q[:, 1:]


def haar_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-distributed n × n orthogonal matrix: QR of a Gaussian matrix with the signs of
    R's diagonal moved into Q (Mezzadri, "How to generate random matrices from the classical
    compact groups", Notices of the AMS 2007)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def reference_score(X: np.ndarray, score: Callable[[np.ndarray], float | None], *, draws: int = DEFAULT_DRAWS,
                    seed: int = 0, max_rows: int = MAX_REFERENCE_ROWS,
                    method: ReferenceMethod = "gaussian", rank: int = 1) -> float | None:
    """The ``rank``-th largest ``score`` over ``draws`` reference data sets shaped like X
    (default the largest; None when no draw could be scored, e.g. fewer than 3 rows). ``score``
    maps a row matrix to the best silhouette the clustering procedure finds in it. A score
    beating the ``rank``-th largest of ``draws`` is a one-sided test at level
    ``rank / (draws + 1)``."""
    if rank < 1:
        raise ValueError(f"reference_score: rank must be 1 or more, got {rank}")
    if draws <= 0 or len(X) < 3:
        return None
    scores = [s for s in (score(R) for R in reference_draws(X, draws, seed, max_rows, method)) if s is not None]
    if not scores:
        return None
    # draws that could not be scored lower the rank with them, so the level stays at most rank / (draws + 1)
    kept_rank = max(1, rank * (len(scores) + 1) // (draws + 1))
    return sorted(scores, reverse=True)[kept_rank - 1]


def same_level(draws: int, rank: int) -> tuple[int, int]:
    """The draws and rank that test at the level of beating the largest of ``draws``
    (one time in ``draws + 1``) with the ``rank``-th largest: ``rank × (draws + 1) − 1``
    draws. The same level from more draws: the threshold is the group-free scores' quantile
    nearly, not one draw's luck, so a test loses less power to its draws (Jöckel, "Finite
    sample properties and asymptotic efficiency of Monte Carlo tests", Annals of Statistics
    1986)."""
    return (draws, 1) if draws <= 0 or rank <= 1 else (rank * (draws + 1) - 1, rank)


def structure_threshold(fixed: float, reference: float | None) -> float:
    """The silhouette a cut must reach: the fixed threshold, lowered to what noise of this
    size reaches when that is less. Never raised above ``fixed``, so every cut accepted
    with the fixed threshold alone is still accepted."""
    return fixed if reference is None else min(fixed, reference)
