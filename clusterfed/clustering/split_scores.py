"""How well a proposed split of a cluster separates it, read from the cosine similarity of
the members' updates (Clustered FL, Sattler et al. 2020). Pure NumPy/SciPy/scikit-learn:

- ``cosine_similarity_matrix``: pairwise cosine similarity of the members' updates;
- ``separation_gap``: Sattler's ``Gap`` computed on the two proposed sides;
- ``split_silhouette``: silhouette of a proposed 2-way split on ``1 - S`` (noise-aware
  acceptance of a split; low for a bi-partition of noise, high for two real groups);
- ``best_cut_silhouette``: the best silhouette over cuts into 2..k clusters (structure in a
  cluster that holds more than two groups, where the 2-way split itself scores low);
- ``as_similarity``, ``as_positions``, ``as_two_sides``, ``cosine_distances``: the checked
  inputs they all share.

Every function answers in positions of the similarity matrix it is given (see
``clusterfed.clustering.bipartition`` for positions vs client keys).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.cluster.hierarchy import cut_tree, fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.metrics import silhouette_score


def cosine_similarity_matrix(U: np.ndarray) -> np.ndarray:
    """(m, d) update rows -> (m, m) cosine similarities in [-1, 1].

    A zero row has no direction: its similarity with every other row is 0 and with itself 1,
    so the matrix never holds NaN.
    """
    U = np.asarray(U, dtype=np.float64)
    if U.ndim != 2:
        raise ValueError(f"expected an (m, d) matrix of updates, got shape {U.shape}")
    norms = np.linalg.norm(U, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    unit = U / safe[:, None]  # zero rows stay zero
    S = unit @ unit.T
    np.clip(S, -1.0, 1.0, out=S)
    np.fill_diagonal(S, 1.0)
    return S


def as_similarity(S: np.ndarray) -> np.ndarray:
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"expected a square (m, m) similarity matrix, got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise ValueError("similarity matrix contains NaN or infinite values")
    return S


def as_positions(positions: Sequence[int] | np.ndarray, m: int, name: str) -> np.ndarray:
    pos = np.asarray(positions, dtype=np.int64).ravel()
    if pos.size and (pos.min() < 0 or pos.max() >= m):
        raise ValueError(f"{name} holds positions outside 0..{m - 1}: {pos.tolist()}")
    if np.unique(pos).size != pos.size:
        raise ValueError(f"{name} repeats a position: {pos.tolist()}")
    return pos


def disjoint_sides(side_a: Sequence[int] | np.ndarray, side_b: Sequence[int] | np.ndarray, m: int,
                   needs: str) -> tuple[np.ndarray, np.ndarray]:
    """The two sides as position arrays; ValueError, naming what ``needs`` them, unless both
    are non-empty and share no position (they need not cover ``range(m)``)."""
    a = as_positions(side_a, m, "side_a")
    b = as_positions(side_b, m, "side_b")
    if a.size == 0 or b.size == 0:
        raise ValueError(f"{needs} needs two non-empty sides")
    if np.intersect1d(a, b).size:
        raise ValueError("the two sides share a position")
    return a, b


def cosine_distances(S: np.ndarray) -> np.ndarray:
    D = 1.0 - (S + S.T) / 2.0  # symmetrise against round-off
    np.fill_diagonal(D, 0.0)
    np.clip(D, 0.0, 2.0, out=D)
    return D


def as_two_sides(side_a: Sequence[int] | np.ndarray, side_b: Sequence[int] | np.ndarray, m: int,
                 what: str = "positions") -> tuple[np.ndarray, np.ndarray]:
    """The two sides as position arrays; ValueError unless they split ``range(m)`` into two
    non-empty parts (``what`` names those m positions in the message)."""
    a = as_positions(side_a, m, "side_a")
    b = as_positions(side_b, m, "side_b")
    if a.size == 0 or b.size == 0:
        raise ValueError("a split needs two non-empty sides")
    covered = np.concatenate([a, b])
    if covered.size != m or np.unique(covered).size != m:
        raise ValueError(f"sides {a.tolist()} / {b.tolist()} do not partition the {m} {what}")
    return a, b


def separation_gap(
    S: np.ndarray, side_a: Sequence[int] | np.ndarray, side_b: Sequence[int] | np.ndarray
) -> float:
    """Sattler's ``Gap`` on two proposed sides: min intra-side similarity − max cross similarity.

    Intra similarities are taken over off-diagonal pairs within each side. A side of size 1
    has no such pair and contributes nothing (a client is trivially consistent with itself);
    if neither side has a pair (two singletons) the intra minimum is the diagonal value 1.0,
    so the gap is ``1 − S[a, b]``. Positive gap: every client is more similar to each member
    of its side than to anyone across. With more than two true groups on a side the gap is
    negative even for a pure split (two groups on one side need not be similar to each other)
    — record it, do not veto on it.
    """
    S = as_similarity(S)
    m = S.shape[0]
    a, b = disjoint_sides(side_a, side_b, m, "separation gap")
    intra_min = 1.0
    for side in (a, b):
        if side.size > 1:
            block = S[np.ix_(side, side)]
            off_diagonal = block[~np.eye(side.size, dtype=bool)]
            intra_min = min(intra_min, float(off_diagonal.min()))
    cross_max = float(S[np.ix_(a, b)].max())
    return intra_min - cross_max


def split_silhouette(
    S: np.ndarray, side_a: Sequence[int] | np.ndarray, side_b: Sequence[int] | np.ndarray
) -> float:
    """Mean silhouette of the 2-way split ``side_a | side_b`` on the cosine distance ``1 - S``
    (``sklearn.metrics.silhouette_score``, precomputed; a member alone on its side scores 0).

    Scale-free (cosines only) and noise-aware: when the updates are a common direction plus
    independent noise, any bi-partition leaves intra ≈ cross distances and the score near 0,
    however the norms behave; two groups of updates pointing different ways score near 1.
    The sides must partition the positions of ``S`` into two non-empty parts.
    """
    S = as_similarity(S)
    m = S.shape[0]
    a, b = as_two_sides(side_a, side_b, m)
    if m == 2:
        return 0.0  # two singletons: sklearn needs 2 <= labels <= m - 1; its convention gives 0
    labels = np.zeros(m, dtype=np.int64)
    labels[b] = 1
    return float(silhouette_score(cosine_distances(S), labels, metric="precomputed"))


def best_cut_silhouette(S: np.ndarray, max_clusters: int) -> tuple[float, int]:
    """Best silhouette on ``1 - S`` over the complete-linkage cuts into 2..``max_clusters``
    clusters (capped at m − 1), and the number of clusters of that cut.
    ``max_clusters = 2`` scores the proposed bi-partition only.

    Why look past two clusters: a cluster holding four groups is split first into two sides
    that each hold two groups, and that 2-way split scores low (each side is loose) although
    the cluster has clear structure; the cut into four scores high. Noise has no good cut at
    any k. Returns ``(0.0, 1)`` when no cut can be scored (m < 3 or ties everywhere).
    """
    S = as_similarity(S)
    m = S.shape[0]
    best = (0.0, 1)
    if m < 3:
        return best
    D = cosine_distances(S)
    Z = linkage(squareform(D, checks=False), method="complete")
    scored = []
    for k in range(2, min(int(max_clusters), m - 1) + 1):
        labels = fcluster(Z, t=k, criterion="maxclust")
        found = np.unique(labels).size
        if 2 <= found <= m - 1:  # ties in the dendrogram can make a k unreachable
            scored.append((float(silhouette_score(D, labels, metric="precomputed")), int(found)))
    return max(scored) if scored else best


def best_cut_labels(S: np.ndarray, max_clusters: int) -> np.ndarray:
    """The labels of ``best_cut_silhouette``'s cut (complete linkage on ``1 - S``, the cut into
    2..``max_clusters`` clusters with the best silhouette); the bi-partition when no cut can be
    scored (m < 3 or ties everywhere), all zeros for fewer than two rows."""
    S = as_similarity(S)
    m = S.shape[0]
    if m < 2:
        return np.zeros(m, dtype=int)
    if m < 3:
        return np.arange(m)
    D = cosine_distances(S)
    Z = linkage(squareform(D, checks=False), method="complete")
    best: tuple[float, np.ndarray] | None = None
    for k in range(2, min(int(max_clusters), m - 1) + 1):
        labels = fcluster(Z, t=k, criterion="maxclust")
        if 2 <= np.unique(labels).size <= m - 1:
            score = float(silhouette_score(D, labels, metric="precomputed"))
            if best is None or score > best[0]:
                best = (score, labels)
    if best is None:
        labels = fcluster(Z, t=2, criterion="maxclust")
        return np.asarray(labels if np.unique(labels).size == 2 else cut_tree(Z, n_clusters=2).ravel(), dtype=int)
    return np.asarray(best[1], dtype=int)
