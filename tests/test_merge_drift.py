"""Merging converged clusters: one round's updates look alike, the drift since the split
tells whether the clusters hold one group or two (``split_rules.merge_pairs``)."""

import numpy as np

from clusterfed.clustering.split_rules import merge_pairs


def converged_clusters(seed: int = 0, members: int = 4, dim: int = 400) -> dict[int, np.ndarray]:
    """Three clusters whose members' updates this round share a common direction plus noise:
    the clusters' mean updates have pairwise cosines near 0.62 and their members are not
    separable (silhouette near 0) — what two converged clusters of different groups send."""
    rng = np.random.default_rng(seed)
    common = rng.normal(size=dim)
    out = {}
    for c in range(3):
        own = rng.normal(size=dim) * 0.4
        out[c] = np.stack([common + own + rng.normal(size=dim) * 1.3 for _ in range(members)])
    return out


def mean_cosine(U: np.ndarray, V: np.ndarray) -> float:
    u, v = U.mean(axis=0), V.mean(axis=0)
    return float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))


def test_the_fixture_is_the_hard_case():
    updates = converged_clusters()
    cosines = [mean_cosine(updates[a], updates[b]) for a, b in ((0, 1), (0, 2), (1, 2))]
    assert all(0.55 < c < 0.7 for c in cosines), cosines
    # without the drift every pair qualifies: the round's updates alone merge true groups
    assert merge_pairs(updates, min_cosine=0.6, max_silhouette=0.5)


def test_distinct_drifts_keep_distinct_groups_apart():
    updates = converged_clusters()
    # the clusters' models moved apart since their split: drift cosines near 0
    pairs = merge_pairs(updates, min_cosine=0.6, max_silhouette=0.5, drift=lambda a, b: 0.05)
    assert pairs == []


def test_same_drift_merges_halves_of_one_group():
    updates = converged_clusters()
    drifts = {(0, 1): 0.9, (0, 2): 0.1, (1, 2): 0.1}  # 0 and 1: one group split in two
    pairs = merge_pairs(updates, min_cosine=0.55, max_silhouette=0.5, drift=lambda a, b: drifts[(a, b)])
    assert [(p.a, p.b) for p in pairs] == [(0, 1)]
    assert pairs[0].drift_cosine == 0.9


def test_one_member_cluster_judged_on_the_round_alone():
    updates = converged_clusters(members=1)
    updates[1] = updates[0] + 0.01  # the same direction this round
    pairs = merge_pairs({0: updates[0], 1: updates[1]}, min_cosine=0.6, drift=lambda a, b: -1.0)
    assert [(p.a, p.b) for p in pairs] == [(0, 1)] and np.isnan(pairs[0].drift_cosine)


def test_clusters_too_small_to_split_are_judged_on_the_round():
    # two 2-member halves of one group, one round after an over-split: their drift is noise
    updates = converged_clusters(members=2)
    pair = {0: updates[0], 1: updates[0] + 0.05}
    assert merge_pairs(pair, min_cosine=0.6, drift=lambda a, b: 0.4) == []
    merged = merge_pairs(pair, min_cosine=0.6, drift=lambda a, b: 0.4, min_drift_members=3)
    assert [(p.a, p.b) for p in merged] == [(0, 1)] and np.isnan(merged[0].drift_cosine)
