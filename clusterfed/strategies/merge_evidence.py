"""When the bi-partition tree (``bipartitioning.py``) merges two leaves on evidence
(``split-timing = evidence``), beyond the merge rule's cosines and silhouette
(``split_rules.merge_pairs``): a merge, like a split, is taken only when it reproduces — the
rule finds the two leaves alike in two successive rounds that both replied to — and never
undoes a split that still shows in the members' updates. Each merge refused or waiting is
kept in ``state.merge_kept``, with its words for the round line."""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.layer_split import split_still_shows
from clusterfed.clustering.reproducible import alike_before, compare
from clusterfed.clustering.split_rules import MergePair
from clusterfed.clustering.split_scores import cosine_similarity_matrix
from clusterfed.clustering.vectors import flatten, stack_float64
from clusterfed.core.exchange import TrainReply
from clusterfed.explain.numbers import compared


def still_split(state: Any, params: Any, server_round: int, a: int, b: int, updates: dict[int, np.ndarray],
                groups: dict[int, list[TrainReply]] | None = None) -> bool:
    """Whether the split between leaves ``a`` and ``b`` still shows this round, on the arrays
    it was decided on (HiCFL's layer, LayerCFL's layers; else the merge's ``updates``): their
    members' bi-partition agrees with their membership (ARI >= split-agreement), or, a side
    holding several groups, the coarsest cut of their updates that lies along the split does,
    and beats group-free rotations (``layer_split.split_still_shows``). A merge never undoes it."""
    node = state.tree.common_ancestor(a, b)
    names = (state.routes.get(node) or {}).get("names") if node is not None else None
    if names and groups and a in groups and b in groups:
        Ua, Ub = (stack_float64([flatten(r.update, names) for r in groups[c]]) for c in (a, b))
    else:
        Ua, Ub = np.atleast_2d(updates[a]), np.atleast_2d(updates[b])
    if Ua.shape[0] + Ub.shape[0] < 3:
        return False
    U, membership = np.vstack([Ua, Ub]).astype(np.float64), np.r_[np.zeros(len(Ua), int), np.ones(len(Ub), int)]
    side_a, _ = bipartition(cosine_similarity_matrix(U))
    found = np.isin(np.arange(len(U)), side_a, invert=True).astype(int)
    check = compare(membership, found, f"clusters {a} and {b}")
    record, bound = check.as_record(), params.split_agreement
    if not check.reproduces(bound):  # each side may hold several groups their bi-partition crosses
        agree, tested = split_still_shows(U, membership, max_k=params.split_silhouette_max_k, seed=params.seed,
                                          bound=bound)
        if tested is None or not tested.passes or agree < bound:
            return False
        record = {"agreement": round(agree, 4), "group_test": tested.as_record(), "group_words": tested.words()}
    how = f" on their best cut, and {record['group_words']}" if "group_words" in record else ""
    state.merge_kept.append({"round": server_round, **record, "leaves": [a, b], "words": (
        f"clusters {a} and {b} not merged: their split still reproduces (ARI "
        f"{compared(record['agreement'], '>=', bound)}{how})")})
    return True


def reproduced_merges(state: Any, server_round: int, pairs: list[MergePair], replied: list[int]) -> list[MergePair]:
    """The ``pairs`` the merge rule found alike this round that it also found alike the last
    round both leaves replied to (``state.merge_alike``: each pair's last such round; a pair of
    ``replied`` leaves not alike this round is forgotten). A pair alike for the first time
    waits, and the round line says so."""
    alike = {_key(p.a, p.b) for p in pairs}
    for i, a in enumerate(replied):
        for b in replied[i + 1:]:
            if _key(a, b) not in alike:
                alike_before(state.merge_alike, _key(a, b), False, server_round)
    taken = []
    for pair in pairs:
        if alike_before(state.merge_alike, _key(pair.a, pair.b), True, server_round) is not None:
            taken.append(pair)
            continue
        state.merge_kept.append({"round": server_round, "leaves": [pair.a, pair.b], "waiting": True,
                                 "cosine": round(pair.cosine, 4), "words": (
            f"clusters {pair.a} and {pair.b} alike this round (round cosine {pair.cosine:.2f}): merged only if "
            f"they are alike again in the next round both reply to")})
    return taken


def _key(a: int, b: int) -> str:
    return f"{min(a, b)}-{max(a, b)}"
