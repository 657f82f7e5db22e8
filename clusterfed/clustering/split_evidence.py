"""The CFL family's evidence that a split is one (``split-timing = evidence``): a cluster's
partition this round against an earlier round's, and how alike its parts point in each.

A client's own data repeat from round to round, so its update keeps its own direction: a cut of
clients of one task can reproduce in successive rounds. Its parts still point the task's way
(while the task is learnt), or did the round before (once it converged): a split is taken only
when the partition reproduces and its parts point apart in both rounds compared, the measure
the merge rule uses (the cosine of two parts' mean updates, ``split_rules.most_alike_sides``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.reproducible import Reproduction, compare, reproduce_on_pairs
from clusterfed.clustering.split_rules import largest_cosine, part_cosines
from clusterfed.clustering.split_scores import best_cut_labels, cosine_similarity_matrix

KINDS = ("best", "two")  # the partitions kept each round: the best-silhouette cut, the bi-partition


@dataclass(frozen=True)
class Evidence:
    """A cluster's partition this round against an earlier round's (split-timing = evidence):
    their agreement (``reproduction``), and how alike the partition's parts point in each of the
    two rounds (``alike``: the largest cosine between two parts' mean updates, the merge rule's
    measure; earlier round's first, None where it was not kept). A split is taken only when the
    partition reproduces and its parts point apart in both rounds (below ``min_cosine``): the
    clients of one task keep their own data's direction from round to round, so a cut of them
    can reproduce, but its parts still point the task's way (or did the round before)."""

    reproduction: Reproduction
    alike: tuple[float | None, float]
    rounds: tuple[int, int]
    halves: bool = False  # the two partitions are one round's chain halves (``halves_evidence``), not two rounds'

    @property
    def agreement(self) -> float:
        return self.reproduction.agreement

    def apart(self, min_cosine: float) -> bool:
        return all(c is not None and c < min_cosine for c in self.alike)

    def passes(self, bound: float, min_cosine: float) -> bool:
        return self.reproduction.reproduces(bound) and self.apart(min_cosine)

    def words(self, bound: float, min_cosine: float) -> str:
        """``rounds 4 and 5 agree (ARI 1.00), parts apart (mean-update cosine 0.12, 0.05 < 0.60)``,
        or why not."""
        said = self.reproduction.words(bound)
        if not self.reproduction.reproduces(bound):
            return said
        then, now = self.alike
        if then is None:
            return f"{said}, but round {self.rounds[0]}'s parts' directions were not kept"
        both = "halves" if self.halves else "rounds"
        if self.apart(min_cosine):
            return f"{said}, parts apart (mean-update cosine {max(then, now):.2f} < {min_cosine:.2f} in both {both})"
        cosine = now if now >= min_cosine else then
        which = (("the second half" if now >= min_cosine else "the first half") if self.halves else
                 f"round {self.rounds[1] if now >= min_cosine else self.rounds[0]}")
        return (f"{said}, but its parts point alike (mean-update cosine {cosine:.2f} >= {min_cosine:.2f} in "
                f"{which}): one task, each client's own data")

    def as_record(self) -> dict[str, Any]:
        then, now = self.alike
        return {**self.reproduction.as_record(), "alike": [None if then is None else round(then, 4), round(now, 4)]}


def pair_evidence(history: list[dict[str, Any]], now: dict[str, Any], keys: list[str], kind: str,
                  need: int) -> Evidence | None:
    """At partial participation, where no earlier round shares ``need`` of this round's clients
    (``keys``): this round's ``kind`` partition against the pairs of them last seen together in
    an earlier kept partition (``history``, oldest first, each ``{"round", kind: {key: label},
    "alike": {kind: cosine}}``; ``reproduce_on_pairs``), None when too few met. The earlier
    round's parts-alike is the latest round used."""
    found = reproduce_on_pairs([(e["round"], e[kind]) for e in history], {k: now[kind][k] for k in keys}, need,
                               now["round"])
    if found is None:
        return None
    reproduction, last = found
    latest_alike = next((e.get("alike") or {}).get(kind) for e in history if e["round"] == last)
    return Evidence(reproduction, (latest_alike, now["alike"][kind]), (last, now["round"]))


def whole_parts_alike(entry: dict[str, Any], kind: str, keys: set[str]) -> tuple[float, dict[str, float]] | None:
    """How alike the parts of an earlier round's partition ``entry[kind]`` restricted to ``keys``
    (a split's child) pointed, exactly, from the part-pair cosines the round kept (``pairs``),
    with the pairs among them; None when the child cuts through one of its parts or the round
    kept no pairs (its Gram matrix is gone)."""
    labels, pairs = entry[kind], (entry.get("pairs") or {}).get(kind)
    if pairs is None:
        return None
    inside = {str(label) for key, label in labels.items() if key in keys}
    if any(str(label) in inside and key not in keys for key, label in labels.items()):
        return None
    kept = {pair: value for pair, value in pairs.items() if set(pair.split("-")) <= inside}
    return largest_cosine(kept), kept


def halves_evidence(first: np.ndarray, second: np.ndarray, first_whole: np.ndarray, second_whole: np.ndarray, *,
                    max_k: int, source: str, server_round: int, bound: float, min_cosine: float) -> Evidence:
    """The CFL family's longer evidence (``strategies/longer_evidence.py``): the partitions of one
    cluster's clients on the two halves of a chain of trainings (rows ``first``, ``second``: each
    client's update over the half, independent SGD draws from different starts), the best-silhouette
    cut (2..``max_k``) and the bi-partition, each with how alike its parts point in each half on
    the whole updates (``*_whole``); the one that passes (``Evidence.passes``), else the best agreement."""
    found = []
    cuts = [(best_cut_labels(cosine_similarity_matrix(U), max_k), two_sides(cosine_similarity_matrix(U)))
            for U in (first, second)]
    grams = [np.asarray(W, dtype=np.float64) @ np.asarray(W, dtype=np.float64).T for W in (first_whole, second_whole)]
    for kind in range(len(KINDS)):
        a, b = cuts[0][kind], cuts[1][kind]
        found.append(Evidence(compare(a, b, source), (largest_cosine(part_cosines(grams[0], a)),
                                                      largest_cosine(part_cosines(grams[1], b))),
                              (server_round, server_round), halves=True))
    return max(found, key=lambda e: (e.passes(bound, min_cosine), e.reproduction.reproduces(bound), e.agreement))


def two_sides(S: np.ndarray) -> np.ndarray:
    """The bi-partition of a similarity matrix as labels (0: the first side)."""
    side_a, _ = bipartition(S)
    return np.isin(np.arange(len(S)), side_a, invert=True).astype(int)
