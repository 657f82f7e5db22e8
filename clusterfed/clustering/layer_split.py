"""HiCFL's split proposal on one layer, pure NumPy (Gong et al., step 5 of
``strategies/hicfl.py``): a bi-partition of the members' updates by the paper's sign of the
cosine with the reference member (``reference``; optionally on updates centred on the members'
weighted mean) or by complete linkage of their cosine similarities (``linkage``), with its
structure score; and the score of group-free rotations a split leaving a small side must beat."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.null_reference import reference_score
from clusterfed.clustering.split_rules import sides_silhouette
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix
from clusterfed.clustering.stability import centred_updates, reference_split
from clusterfed.clustering.vectors import cosine


def propose_split(members: Sequence[Hashable], raw: Mapping[Hashable, np.ndarray], stability: Mapping[Hashable, float],
                  weights: Mapping[Hashable, float] | None, *, rule: str, min_side: int, max_k: int,
                  centre: bool) -> dict[str, Any] | None:
    """The bi-partition of ``members`` (rows ``raw[k]``) by ``rule``: its sides, structure score,
    cosine matrix ``S`` of the raw updates, the route's rule, directions and centre, and its
    record; None when a side would hold fewer than ``min_side`` members (linkage) or the
    reference rule puts everyone on one side."""
    U = np.stack([raw[k] for k in members])
    S = cosine_similarity_matrix(U)  # raw: comparable with CFL's
    if rule == "linkage":
        side_a, side_b = bipartition(S)
        if min(len(side_a), len(side_b)) < min_side:
            return None  # one outlier client is not a group (min-side)
        score = float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(U, side_a, side_b)
        return {"keys": ([members[i] for i in side_a], [members[i] for i in side_b]), "score": score, "S": S,
                "rule": "nearest-mean", "directions": [U[side_a].mean(axis=0), U[side_b].mean(axis=0)],
                "centre": None, "record": {"rule": "linkage"}}
    # the paper: reference c_r = argmin S; cos(Δ_r, Δ_j) > 0 joins its side
    updates = centred_updates(raw, weights) if centre else raw
    sides = reference_split(updates, stability)
    if sides is None:
        return None
    position = {k: i for i, k in enumerate(members)}
    reference = min(members, key=lambda k: stability[k])  # reference_split's argmin (first on ties)
    score = sides_silhouette(U, [position[k] for k in sides[0]], [position[k] for k in sides[1]])
    record = {"rule": "reference", "reference": reference, "centred": centre,
              "centred_similarity_to_reference": {k: round(cosine(updates[reference], updates[k]), 4) for k in members}}
    return {"keys": sides, "score": score, "S": S, "rule": "reference", "directions": [updates[reference]],
            "centre": raw[reference] - updates[reference] if centre else None, "record": record}


def small_side_reference(U: np.ndarray, smallest: int, *, rule: str, draws: int, min_split_size: int, max_k: int,
                         seed: int) -> float | None:
    """The best-cut silhouette a linkage split whose smallest side holds ``smallest`` (2 to
    ``min_split_size`` − 1) members must beat: the largest over ``draws`` rotation-test draws of
    the updates ``U`` (``null_reference``). None when the side is larger or a single client (an
    outlier ``min-side = 1`` asked for: rotations cannot judge it), for the reference rule, or
    with ``draws`` = 0. Noise split into small sides reaches a fixed threshold easily (a 2 | 2
    cut of 4 noisy updates scores about 0.5); where one direction dominates the rotations keep it."""
    if draws <= 0 or rule != "linkage" or smallest >= min_split_size or smallest < 2:
        return None

    def score(R: np.ndarray) -> float:
        S = cosine_similarity_matrix(R)
        return float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(R, *bipartition(S))

    return reference_score(U.astype(np.float64), score, draws=draws, seed=seed, method="rotation")


# split-timing = evidence: the rotation draws every split into sides of min-split-size or more
# must beat (a one-sided 5 % test); smaller sides keep their own draws (small_side_reference)
EVIDENCE_DRAWS = 19


def evidence_reference(U: np.ndarray, smallest: int, *, rule: str, small_draws: int, min_split_size: int,
                       max_k: int, seed: int) -> tuple[float | None, str]:
    """What a linkage split on evidence must beat, and which test it is: ``small`` (a side of 2
    to ``min_split_size`` − 1 members: ``small_side_reference`` with ``small_draws``) or
    ``group_free`` (any larger split: the best of ``EVIDENCE_DRAWS`` rotation-test draws of the
    members' updates ``U``). Why: within a round the clients of one task differ by their own
    data, independently of one another, so their updates are exchangeable rows, which is what
    the rotations keep; the same clients' data repeat from round to round, so a cut of them can
    reproduce, but it does not beat its rotations. True groups do (their means are mixed away).
    (None, "") for one-client sides, the reference rule, or fewer than 4 members."""
    small = small_side_reference(U, smallest, rule=rule, draws=small_draws, min_split_size=min_split_size,
                                 max_k=max_k, seed=seed)
    if small is not None:
        return small, "small"
    if rule != "linkage" or smallest < max(2, min_split_size) or len(U) < 4:
        return None, ""

    def score(R: np.ndarray) -> float:
        S = cosine_similarity_matrix(R)
        return float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(R, *bipartition(S))

    return reference_score(np.asarray(U, dtype=np.float64), score, draws=EVIDENCE_DRAWS, seed=seed,
                           method="rotation"), "group_free"
