"""HiCFL's split proposal on one layer, pure NumPy (Gong et al., step 5 of
``strategies/hicfl.py``): a bi-partition of the members' updates by the paper's sign of the
cosine with the reference member (``reference``; optionally on updates centred on the members'
weighted mean) or by complete linkage of their cosine similarities (``linkage``), with its
structure score; and the test against group-free rotations a split on evidence must pass."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from scipy.cluster import hierarchy

from clusterfed.clustering.agglomerative import cluster_auto, linkage_matrix, relabel_in_order
from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.group_structure import GroupTest, group_test
from clusterfed.clustering.null_reference import reference_score, same_level
from clusterfed.clustering.reproducible import agreement
from clusterfed.clustering.split_rules import sides_silhouette
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix
from clusterfed.clustering.stability import centred_updates, reference_split
from clusterfed.clustering.vectors import cosine
from clusterfed.explain.numbers import compared


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


def best_cut_score(R: np.ndarray, *, max_k: int) -> float:
    """The structure score of a linkage split of the rows ``R`` (what a rotation of them is
    scored by): the best-cut silhouette on their cosines up to ``max_k`` parts, or with
    ``max_k`` <= 2 the two sides' silhouette."""
    S = cosine_similarity_matrix(R)
    return float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(R, *bipartition(S))


def small_side_reference(U: np.ndarray, smallest: int, *, rule: str, draws: int, min_split_size: int, max_k: int,
                         seed: int) -> float | None:
    """The best-cut silhouette a linkage split whose smallest side holds ``smallest`` (2 to
    ``min_split_size`` − 1) members must beat: a rotation test of the updates ``U``
    (``null_reference``) at the level of the largest of ``draws`` draws (one time in
    ``draws + 1``), read as the ``SMALL_SIDE_RANK``-th largest of ``SMALL_SIDE_RANK`` ×
    (``draws`` + 1) − 1 draws (``same_level``). None when the side is larger or a single client (an outlier
    ``min-side = 1`` asked for: rotations cannot judge it), for the reference rule, or with
    ``draws`` = 0. Noise split into small sides reaches a fixed threshold easily (a 2 | 2 cut of
    4 noisy updates scores about 0.5); where one direction dominates the rotations keep it. Why
    more draws: the rotations of 4 to 8 rows keep most of their shape, so one draw often
    clumps them nearly as well as true groups do; the largest of few draws is that draw's luck,
    and being seeded, the same draw refused the same true pair round after round."""
    if draws <= 0 or rule != "linkage" or smallest >= min_split_size or smallest < 2:
        return None
    draws, rank = same_level(draws, SMALL_SIDE_RANK)
    return reference_score(U.astype(np.float64), partial(best_cut_score, max_k=max_k), draws=draws, seed=seed,
                           method="rotation", rank=rank)


def small_cluster_draws(members: int, min_split_size: int, draws: int) -> int:
    """The level a small side is tested at on evidence, as the largest of this many rotations
    (``small_side_reference`` reads it from more draws), in a cluster of ``members`` members:
    ``draws`` (a stricter level than other splits': a side of 2 beside a side that could have
    been split evenly is as often two alike clients of one group, each client's own data, as a
    group), but no more than ``EVIDENCE_DRAWS`` below 2 × ``min_split_size`` members, where every
    split leaves a small side: there the small-side test is the only route to a split and is held
    to the level of every other split (with 4 or 5 members the rotations keep most of the rows'
    shape, so 99 draws refused true 2 | 2 groups round after round). Why only on evidence: the
    split is then taken only when two rounds' partitions agree, which noise redrawn each round
    rarely does; a split on Sattler's criteria is taken the first round it passes."""
    return min(draws, EVIDENCE_DRAWS) if members < 2 * min_split_size else draws


# the small-side test's rotations: the level of the largest of its draws, read as this rank of
# rank × (draws + 1) − 1 draws (1: the largest of the draws themselves, the rule before)
SMALL_SIDE_RANK = 5

# split-timing = evidence: the rotation draws every split into sides of min-split-size or more
# must beat (a one-sided 5 % test); smaller sides keep their own level (small_side_reference)
EVIDENCE_DRAWS = 19
# the fewest members whose split the group test judges; below, the rotations' silhouette alone:
# two groups of 4 clients (the suite's 8-client LayerCFL run on digits) did not beat rotations
# in their parts' separation, and the development draws' splits of 8 to 11 members changed little
EVIDENCE_TEST_MIN_ROWS = 12


@dataclass(frozen=True)
class EvidenceTest:
    """What a linkage split on evidence is tested against, and which test: ``small`` (a side of 2
    to min-split-size − 1 members: its best-cut silhouette against the rotations' ``reference``),
    ``group_free`` (any larger split: on ``EVIDENCE_TEST_MIN_ROWS`` or more members the group test ``groups``
    of the members' best cut, else the silhouette against ``reference``), or ``""`` (none)."""

    test: str
    reference: float | None = None
    groups: GroupTest | None = None
    parts: int = 2

    def passes(self, structure: float) -> bool:
        if self.groups is not None:
            return self.groups.passes
        return self.reference is None or structure > self.reference

    def words(self, structure: float, smallest: int) -> str:
        """Why a split that does not pass was refused, with the numbers compared."""
        if self.groups is not None:
            return f"its members' updates cut into {self.parts} parts, but {self.groups.words()}: one task's spread"
        scored = f"(best-cut silhouette {compared(structure, '<=', self.reference)})"
        if self.test == "small":
            return f"a side of {smallest} clients scored no better than group-free rotations {scored}"
        return (f"its cut scored no better than group-free rotations of the updates {scored}: one task, each "
                f"client's own data")

    def as_record(self) -> dict[str, Any]:
        """The group test's numbers and words (empty without it)."""
        if self.groups is None:
            return {}
        return {"group_test": self.groups.as_record(), "group_words": self.groups.words(), "group_parts": self.parts}


def evidence_reference(U: np.ndarray, smallest: int, *, rule: str, small_draws: int, min_split_size: int,
                       max_k: int, seed: int, members: int, draws: int = EVIDENCE_DRAWS) -> EvidenceTest:
    """The test a linkage split whose smallest side holds ``smallest`` members must pass on
    evidence, in a cluster of ``members`` members. A small side (2 to ``min_split_size`` − 1
    members): ``small_side_reference`` with ``small_draws``, at most ``EVIDENCE_DRAWS`` below
    2 × ``min_split_size`` members (``small_cluster_draws``). Any larger split: the members'
    updates ``U`` cut at their best silhouette (up to ``max_k`` parts) against ``draws`` group-free
    rotations of them (``group_structure.group_test``: the parts' separation and the silhouette;
    below ``EVIDENCE_TEST_MIN_ROWS`` members the best of the rotations' silhouettes alone);
    ``draws`` is ``EVIDENCE_DRAWS``, more where the split was chosen among several tests
    (``null_reference.shared_draws``). Why: within a round the
    clients of one task differ by their own data, independently of one another, so their
    updates are exchangeable rows, which is what the rotations keep; the same clients' data
    repeat from round to round, so a cut of them can reproduce, but it does not beat its
    rotations. True groups do (their means are mixed away). The members' best cut, not the
    two-sided split, is tested: a split of several groups into two holds whole groups on each
    side, whose spread is not the members' own. No test for one-client sides, the reference
    rule, or fewer than 4 members."""
    small = small_side_reference(U, smallest, rule=rule, draws=small_cluster_draws(members, min_split_size, small_draws),
                                 min_split_size=min_split_size, max_k=max_k, seed=seed)
    if small is not None:
        return EvidenceTest("small", small)
    if rule != "linkage" or smallest < max(2, min_split_size) or len(U) < 4:
        return EvidenceTest("")
    U = np.asarray(U, dtype=np.float64)
    if len(U) >= EVIDENCE_TEST_MIN_ROWS:  # group_test itself asks MIN_ROWS or more
        best = cluster_auto(U, metric="cosine", linkage="complete", min_silhouette=-1.0, max_clusters=max_k).labels
        tested = group_test(U, best, metric="cosine", linkage="complete", max_clusters=max_k, draws=draws,
                            seed=seed)
        if tested is not None:
            return EvidenceTest("group_free", tested.rotated_silhouette, tested, len(np.unique(best)))

    return EvidenceTest("group_free", reference_score(U, partial(best_cut_score, max_k=max_k), draws=draws,
                                                      seed=seed, method="rotation"))


def split_still_shows(U: np.ndarray, sides: np.ndarray, *, max_k: int, seed: int, bound: float
                      ) -> tuple[float, GroupTest | None]:
    """Whether a split of two clusters still shows in their members' updates ``U`` (``sides``:
    each row's cluster, 0 or 1) when a side holds several groups, which their best bi-partition
    need not follow: the coarsest cut of the rows' dendrogram (complete linkage of cosine
    distances, 2 to ``max_k`` parts) whose parts, each given the side most of its rows are on,
    agree with ``sides`` (adjusted Rand index at least ``bound``), and the group test of that cut
    (``group_structure.group_test``). Returns (that agreement, or the best one when no cut
    reaches the bound; the test, None without such a cut or below ``EVIDENCE_TEST_MIN_ROWS`` rows)."""
    U, sides = np.asarray(U, dtype=np.float64), np.asarray(sides, dtype=int)
    if len(U) < EVIDENCE_TEST_MIN_ROWS:
        return 0.0, None
    Z = linkage_matrix(U, metric="cosine", linkage="complete")
    best = 0.0
    for k in range(2, min(max_k, len(U) - 1) + 1):
        cut = relabel_in_order(hierarchy.fcluster(Z, t=k, criterion="maxclust"))
        coarse = np.empty_like(sides)
        for part in np.unique(cut):
            coarse[cut == part] = np.bincount(sides[cut == part], minlength=2).argmax()
        agree = agreement(sides, coarse)
        if agree >= bound:
            return agree, group_test(U, cut, metric="cosine", linkage="complete", max_clusters=max_k,
                                     draws=EVIDENCE_DRAWS, seed=seed)
        best = max(best, agree)
    return best, None
