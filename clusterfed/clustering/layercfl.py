"""LayerCFL's correct-clustering check ("LayerCFL: efficient clustered federated learning with
layer-wised clustering", Theorem 1 / eq. 20) and the true-group Gap.

Theorem 1 (after Sattler et al. 2020): client i's empirical gradient deviates from the true
gradient of its own data distribution by at most a fraction γ_i of that gradient's norm,

    γ_i = ||∇R_i(θ*) − ∇r_i(θ*)|| / ||∇R_i(θ*)|| ∈ [0, 1)              (eq. 15)

and a bi-partition is correct (no distribution is cut in two) if

    sqrt((1 − α_cross_max) / 2) > γ_max                                  (eq. 20)

with α_cross_max the largest cosine similarity across the two sides. The true gradients
∇R_i are unknown, so γ_max must be estimated from the members' updates. See
``estimate_gammas`` for the estimator and why.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from clusterfed.clustering.split_scores import as_similarity, cosine_similarity_matrix, disjoint_sides

GAMMA_ESTIMATORS = ("nearest_peer", "side_mean")


@dataclass(frozen=True)
class CheckResult:
    """Outcome of eq. 20: ``passed`` ⇔ ``bound`` = sqrt((1 − alpha_cross_max)/2) > ``gamma_max``."""

    passed: bool
    alpha_cross_max: float
    gamma_max: float
    bound: float


def estimate_gammas(
    U: np.ndarray,
    side_a: Sequence[int] | np.ndarray,
    side_b: Sequence[int] | np.ndarray,
    *,
    estimator: str = "nearest_peer",
    similarity: np.ndarray | None = None,
) -> np.ndarray:
    """Per-client estimate of γ_i for the clients on the two sides (indexed like ``U``;
    clients on neither side get NaN).

    ``nearest_peer`` (default). A client's true-distribution gradient is approximated by
    its most similar peer *on its own side*: with α = cos(Δ_i, Δ_peer),

        γ_i = sqrt(1/α − 1)      (∞ if α <= 0).

    Why: if two clients of one distribution deviate from its gradient g by independent
    errors of relative size γ (orthogonal to g and to each other, the typical case in high
    dimension) then cos = 1/(1 + γ²); inverting gives γ. The nearest peer, not the side's
    mean, is the reference because at the first levels of a hierarchy a side still holds
    several distributions: its mean is not any client's true gradient and the side-mean
    deviation is of order 1 (two orthogonal groups on one side give γ = 1 > sqrt(1/2)), which
    vetoes every correct top-level split. A client's nearest peer lies in its own group as
    long as groups have ≥ 2 clients, so the estimate measures only within-distribution noise.
    On a single noisy distribution the rule still fails: all pairwise similarities are then
    ≈ 1/(1+γ²) ≈ 1 − γ², and passing would need (1 − α_cross)/2 > 1/α_nn − 1 ≈ 1 − α_nn,
    i.e. every client's nearest peer twice as close (in 1 − cos) as the closest pair across
    the cut, which independent noise around one direction does not produce. That factor 2
    is the gap between the theorem's worst case (opposite deviations, cos = 1 − 2γ²) and
    the typical independent case used here.

    ``side_mean``: γ_i = ||Δ_i − μ_side|| / ||μ_side|| with μ_side the plain mean of the
    client's side. Literal reading of eq. 15 with the side as the distribution; right at
    the last level of a hierarchy only, and on small sides it also lets noise splits
    through (for a pair, γ = half their distance, which the clustering made smaller than
    the cross distance). Kept for comparison, not the default.

    A client alone on its side has no peer: its γ is taken as the largest γ of the clients
    that have one (the noise level is assumed shared); if no client has a peer (two
    singletons), every γ is ∞ and the check cannot pass — one update per side tells nothing
    about within-distribution noise.
    """
    if estimator not in GAMMA_ESTIMATORS:
        raise ValueError(f"unknown gamma estimator {estimator!r}; expected one of {GAMMA_ESTIMATORS}")
    U = np.asarray(U, dtype=np.float64)
    if U.ndim != 2:
        raise ValueError(f"expected an (m, d) matrix of updates, got shape {U.shape}")
    m = U.shape[0]
    a, b = disjoint_sides(side_a, side_b, m, "the check")
    S = cosine_similarity_matrix(U) if similarity is None else as_similarity(similarity)

    gammas = np.full(m, np.nan)
    singletons: list[int] = []
    for side in (a, b):
        if side.size == 1:
            singletons.append(int(side[0]))
            continue
        if estimator == "nearest_peer":
            block = S[np.ix_(side, side)].copy()
            np.fill_diagonal(block, -np.inf)
            alpha_nn = block.max(axis=1)
            with np.errstate(divide="ignore"):
                g = np.where(alpha_nn > 0, np.sqrt(np.maximum(1.0 / alpha_nn - 1.0, 0.0)), np.inf)
        else:
            mu = U[side].mean(axis=0)
            mu_norm = float(np.linalg.norm(mu))
            dev = np.linalg.norm(U[side] - mu, axis=1)
            g = dev / mu_norm if mu_norm > 0 else np.full(side.size, np.inf)
        gammas[side] = g
    if singletons:
        peered = gammas[~np.isnan(gammas)]  # clients with a same-side peer (∞ included)
        fill = float(peered.max()) if peered.size else np.inf
        gammas[singletons] = fill
    return gammas


def correct_clustering_check(
    U: np.ndarray,
    side_a: Sequence[int] | np.ndarray,
    side_b: Sequence[int] | np.ndarray,
    *,
    estimator: str = "nearest_peer",
    similarity: np.ndarray | None = None,
) -> CheckResult:
    """LayerCFL eq. 20 on a proposed bi-partition of the rows of ``U`` (positions).

    ``similarity``: the cosine matrix of ``U`` if already computed. γ_max is the largest
    per-client estimate from ``estimate_gammas``. A split that fails is to be discarded
    (the cluster stays whole).
    """
    U = np.asarray(U, dtype=np.float64)
    S = cosine_similarity_matrix(U) if similarity is None else as_similarity(similarity)
    gammas = estimate_gammas(U, side_a, side_b, estimator=estimator, similarity=S)
    a = np.asarray(side_a, dtype=np.int64).ravel()
    b = np.asarray(side_b, dtype=np.int64).ravel()
    alpha_cross_max = float(S[np.ix_(a, b)].max())
    bound = float(np.sqrt(max(1.0 - alpha_cross_max, 0.0) / 2.0))
    gamma_max = float(np.nanmax(gammas[np.concatenate([a, b])]))
    return CheckResult(
        passed=bool(bound > gamma_max),
        alpha_cross_max=alpha_cross_max,
        gamma_max=gamma_max,
        bound=bound,
    )


def true_group_gap(S: np.ndarray, groups: Sequence[Hashable] | np.ndarray) -> float:
    """Sattler's Gap against the ground-truth groups (metrics only, never used to decide).

    ``groups``: one group id per row of ``S``. Gap = min similarity between two different
    clients of the same group − max similarity between clients of different groups.
    Groups of one client contribute no same-group pair; with no same-group pair at all the
    minimum is the diagonal value 1.0. With a single group there is no cross pair and the
    gap is undefined: NaN.
    """
    S = as_similarity(S)
    labels = np.asarray(list(groups), dtype=object)
    if labels.size != S.shape[0]:
        raise ValueError(f"{labels.size} group ids for {S.shape[0]} clients")
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(S.shape[0], dtype=bool)
    cross = ~same
    if not cross.any():
        return float("nan")
    intra_pairs = same & off_diagonal
    intra_min = float(S[intra_pairs].min()) if intra_pairs.any() else 1.0
    return intra_min - float(S[cross].max())
