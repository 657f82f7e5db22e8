"""Pieces that make the stability-timed and layer-wise bi-partitions usable with default
settings on real SGD updates, and that let an over-split tree repair itself.

- ``relative_stability``: a layer's windowed model stability (HiCFL, Gong et al., "Towards
  Hierarchical Clustered Federated Learning With Model Stability on Mobile Devices") divided
  by that layer's own scale — the members' median windowed stability when the cluster's
  windows first filled. An absolute ε (0.5·η) compares layers whose stability differs by a
  factor 3 (output layer ~0.01, conv layers ~0.03 on the digits CNN at η = 0.05).
- ``ready_layers``: the layers whose relative stability is below ``eps_rel`` for every member
  (the paper's rule) or for the median member.
- ``choose_split``: among candidate bi-partitions (one per layer), the best-separated one by
  silhouette on cosine distances, accepted only if it reaches a minimum — a structure test
  before a split, as CFL's acceptance test.
- ``best_separated_layers``: for an unknown skew, the layer group (e.g. conv vs fc) whose
  updates show the most structure (best-cut silhouette).
- ``most_alike_sides``: how alike the parts of a partition point (the cosine of their mean
  vectors, the merge rule's measure), from the rows' Gram matrix.
- ``merge_pairs``: which leaf clusters to merge because their members' updates have become
  indistinguishable.
- ``one_cluster_reason``: the sentence to report when a run ends with a single cluster;
  ``refusal_counts``: the refused attempts counted by reason code.

Pure NumPy/SciPy; client keys and layer names are any hashables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix, split_silhouette

# --------------------------------------------------------------------------- relative stability


def layer_scale(windowed: Mapping[Hashable, float | None]) -> float | None:
    """A layer's stability scale: the median of the members' windowed stabilities (None
    while any window is not full; a zero median is replaced by the largest value, and
    None is returned when every value is zero — no scale to compare against)."""
    values = list(windowed.values())
    if not values or any(v is None for v in values):
        return None
    arr = np.asarray(values, dtype=np.float64)
    scale = float(np.median(arr))
    if scale <= 0.0:
        scale = float(arr.max())
    return scale if scale > 0.0 else None


def relative_stability(windowed: Mapping[Hashable, float | None], scale: float | None) -> dict | None:
    """Each member's windowed stability divided by the layer's ``scale`` (see
    ``layer_scale``); None when a window is not full or there is no scale."""
    if scale is None or scale <= 0.0 or any(v is None for v in windowed.values()):
        return None
    return {k: float(v) / float(scale) for k, v in windowed.items()}


READY_TIMINGS = ("all", "median")


def ready_layers(relative_by_layer: Mapping[Hashable, Mapping[Hashable, float] | None], eps_rel: float,
                 timing: str = "all") -> list:
    """Layers (input order) whose stability is < ``eps_rel``: for every member
    (``timing = "all"``, the paper's rule) or for the median member (``"median"``: one
    noisy member cannot hold the whole cluster back). The values may be relative
    (``relative_stability``) or absolute stabilities with an absolute ε."""
    if timing not in READY_TIMINGS:
        raise ValueError(f"timing must be one of {READY_TIMINGS}, got {timing!r}")
    out = []
    for layer, rel in relative_by_layer.items():
        if not rel:
            continue
        values = np.fromiter(rel.values(), dtype=np.float64)
        if (values.max() if timing == "all" else float(np.median(values))) < eps_rel:
            out.append(layer)
    return out


# --------------------------------------------------------------------------- structure test


@dataclass(frozen=True)
class SplitChoice:
    """The chosen candidate (``layer`` None: every candidate refused) and every candidate's
    silhouette."""

    layer: Hashable | None
    silhouette: float
    silhouettes: dict


def sides_silhouette(U: np.ndarray, side_a: Sequence[int], side_b: Sequence[int]) -> float:
    """Silhouette of a 2-way split of the rows of ``U`` on cosine distances 1 − cos."""
    return split_silhouette(cosine_similarity_matrix(np.asarray(U, dtype=np.float64)), side_a, side_b)


def choose_split(candidates: Mapping[Hashable, tuple[np.ndarray, Sequence[int], Sequence[int]]],
                 min_silhouette: float) -> SplitChoice:
    """``candidates``: layer -> (updates (m, d), side a positions, side b positions). The
    layer whose split has the largest silhouette is chosen if that silhouette reaches
    ``min_silhouette``; otherwise ``layer`` is None (no split this round). Ties: the first."""
    return pick_best(scores_of_splits(candidates), min_silhouette)


def scores_of_splits(candidates: Mapping[Hashable, tuple[np.ndarray, Sequence[int], Sequence[int]]]) -> dict:
    """layer -> silhouette of its candidate split (``choose_split``'s candidates)."""
    return {layer: sides_silhouette(U, a, b) for layer, (U, a, b) in candidates.items()}


def pick_best(scores: Mapping[Hashable, float], min_score: float) -> SplitChoice:
    """The candidate with the largest score, chosen if it reaches ``min_score`` (ties: the
    first); ``layer`` None when there is none or it falls short."""
    if not scores:
        return SplitChoice(None, float("nan"), {})
    best = max(scores, key=lambda k: scores[k])
    best_score = float(scores[best])
    return SplitChoice(best if best_score >= min_score else None, best_score, dict(scores))


def best_separated_layers(updates_by_group: Mapping[Hashable, np.ndarray], max_clusters: int = 6) -> tuple:
    """(name, {name: best-cut silhouette}) — the layer group whose members' updates show the
    most structure: the best silhouette over complete-linkage cuts into 2..``max_clusters``
    clusters of 1 − cos (``bipartition.best_cut_silhouette``). Ties: the first."""
    scores = {}
    for name, U in updates_by_group.items():
        S = cosine_similarity_matrix(np.asarray(U, dtype=np.float64))
        scores[name] = float(best_cut_silhouette(S, max_clusters)[0])
    if not scores:
        raise ValueError("no layer group to choose from")
    best = max(scores, key=lambda k: scores[k])
    return best, scores


# --------------------------------------------------------------------------- merging


@dataclass(frozen=True)
class MergePair:
    a: Hashable
    b: Hashable
    cosine: float  # cosine of the two clusters' mean updates
    silhouette: float  # silhouette of the two clusters' members, labelled by cluster
    drift_cosine: float = float("nan")  # cosine of their model drifts since the split between them


def most_alike_sides(gram: np.ndarray, labels: Sequence[Hashable]) -> float:
    """The largest cosine between two parts' mean vectors, from the rows' Gram matrix
    (``U @ U.T``) and each row's part (``labels``); -1.0 with fewer than two parts, 0.0 for a
    part whose mean is zero. Why (the CFL family's evidence timing): a part of clients of one
    task keeps pointing the task's way, however reproducibly its own clients' data set them
    apart; parts of different tasks do not."""
    return largest_cosine(part_cosines(gram, labels))


def largest_cosine(pairs: Mapping[str, float]) -> float:
    """The largest of ``part_cosines``' values: how alike the most alike two parts point
    (-1.0 with fewer than two parts)."""
    return max(pairs.values(), default=-1.0)


def part_cosines(gram: np.ndarray, labels: Sequence[Hashable]) -> dict[str, float]:
    """The cosine between every two parts' mean vectors (``most_alike_sides`` takes the
    largest), keyed ``"a-b"`` by the parts' labels in order of first appearance: kept with a
    round's partition, it scores a union of whole parts once the rows are gone."""
    G = np.asarray(gram, dtype=np.float64)
    labels = np.asarray(labels)
    values = list(dict.fromkeys(labels.tolist()))
    parts = [np.flatnonzero(labels == v) for v in values]
    out: dict[str, float] = {}
    for i, a in enumerate(parts):
        for j in range(i + 1, len(parts)):
            b = parts[j]
            cross = G[np.ix_(a, b)].mean()
            norm = float(np.sqrt(max(G[np.ix_(a, a)].mean(), 0.0) * max(G[np.ix_(b, b)].mean(), 0.0)))
            out[f"{values[i]}-{values[j]}"] = 0.0 if norm == 0 else float(cross / norm)
    return out


def merge_pairs(updates_by_cluster: Mapping[Hashable, np.ndarray], *, min_cosine: float = 0.6,
                max_silhouette: float = 0.5,
                drift: Callable[[Hashable, Hashable], float] | None = None,
                min_drift_members: int = 2, match: bool = True) -> list[MergePair]:
    """Pairs of clusters to merge: the cosine of their members' mean updates is at least
    ``min_cosine`` AND the silhouette of their joint members (labelled by cluster, on
    1 − cos of the individual updates) is at most ``max_silhouette`` — the two clusters
    move the same way and their members are no better separated than noise.

    ``updates_by_cluster``: cluster -> (m_c, d) updates of its members (the same layers,
    each cluster's members on its own model). Clusters with fewer than 2 members are
    judged on the cosine alone (no silhouette; reported as NaN). Greedy: pairs sorted by
    cosine, best first, each cluster in at most one pair per call (repeat next round for
    chains; ``match = False``: every pair that passes, for a caller that filters them first and
    then calls ``match_pairs``).

    ``drift(a, b)``: the cosine of the two clusters' model drifts since the split that
    separated them (NaN: unknown). Two clusters of at least ``min_drift_members`` members
    each are merged only if it, too, reaches ``min_cosine``: once both have converged, one round's updates are
    mostly noise and look alike whether or not the clusters hold the same group, while the
    drift sums every round's pull (two halves of one group drift the same way, two groups
    apart). A smaller cluster is judged on this round's updates alone (and a one-member
    cluster on their cosine alone): a side too small to be split itself is what an
    over-split leaves, and its drift over the few rounds since is mostly noise.
    """
    names = list(updates_by_cluster)
    mats = {c: np.atleast_2d(np.asarray(updates_by_cluster[c], dtype=np.float64)) for c in names}
    found = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ma, mb = mats[a].mean(axis=0), mats[b].mean(axis=0)
            na, nb = float(np.linalg.norm(ma)), float(np.linalg.norm(mb))
            cos = float(np.dot(ma, mb) / (na * nb)) if na > 0 and nb > 0 else 0.0
            if cos < min_cosine:
                continue
            if mats[a].shape[0] >= 2 and mats[b].shape[0] >= 2:
                U = np.vstack([mats[a], mats[b]])
                sil = sides_silhouette(U, np.arange(mats[a].shape[0]),
                                       np.arange(mats[a].shape[0], U.shape[0]))
                if sil > max_silhouette:
                    continue
                small = min(mats[a].shape[0], mats[b].shape[0]) < min_drift_members
                drift_cos = float("nan") if drift is None or small else float(drift(a, b))
                if drift_cos < min_cosine:  # NaN passes: no drift known
                    continue
            else:
                sil, drift_cos = float("nan"), float("nan")
            found.append(MergePair(a, b, cos, sil, drift_cos))
    return match_pairs(found) if match else found


def match_pairs(pairs: Sequence[MergePair]) -> list[MergePair]:
    """Greedy: ``pairs`` by cosine, best first, each cluster in at most one of them."""
    used: set = set()
    out = []
    for p in sorted(pairs, key=lambda p: -p.cosine):
        if p.a in used or p.b in used:
            continue
        used.update((p.a, p.b))
        out.append(p)
    return out


# --------------------------------------------------------------------------- no silent FedAvg

MERGED_BACK = "every split was undone by merging: the clusters' updates became indistinguishable"


def one_cluster_reason(reasons: dict[str, str], refusals: Sequence[str], could_split: bool = True, splits: int = 0,
                       timing: str = "criteria") -> str:
    """The sentence to report when a bi-partitioning run ends with one cluster.

    ``reasons``: the strategy's reason code -> sentence (each strategy module declares its
    own). ``refusals``: the reason codes of every refused/failed split attempt; none means
    the timing criterion (code ``timing``: CFL's criteria, HiCFL's stability) never held.
    ``could_split``: whether size and round rules ever allowed a split (else code
    ``size``); ``splits``: how many splits were made (all merged back). The most frequent
    refusal is reported, with all counts.
    """
    if splits:  # split, then merged back into one cluster
        return f"{MERGED_BACK} ({splits} splits)"
    if not could_split:
        return reasons["size"]
    if not refusals:
        return reasons[timing]
    top = Counter(refusals).most_common(1)[0][0]  # ties: the first met
    return f"{reasons.get(top, top)} ({refusal_counts(refusals)})"


def refusal_counts(refusals: Sequence[str]) -> str:
    """"code ×n, ..." for the refusals' reason codes, most frequent first (ties: first met)."""
    return ", ".join(f"{code} ×{n}" for code, n in Counter(refusals).most_common())
