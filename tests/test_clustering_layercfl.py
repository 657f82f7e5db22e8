"""LayerCFL correct-clustering check (eq. 20) and the true-group Gap."""

import numpy as np
import pytest

from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.split_scores import cosine_similarity_matrix
from clusterfed.clustering.layercfl import (
    correct_clustering_check,
    estimate_gammas,
    true_group_gap,
)

DIM = 200


def _four_groups(noise, seed, pair_similarity=0.3):
    """4 groups × 3 clients: update = group direction + noise.

    Groups 0,1 share an axis (cos = pair_similarity), so do groups 2,3; the two pairs are
    orthogonal. Noise has norm ≈ ``noise`` (relative to the unit group direction).
    """
    rng = np.random.default_rng(seed)
    E = np.eye(DIM)
    c, s = np.sqrt(pair_similarity), np.sqrt(1 - pair_similarity)
    directions = [c * E[0] + s * E[1], c * E[0] + s * E[2], c * E[3] + s * E[4], c * E[3] + s * E[5]]
    order = rng.permutation(12)  # clients in no particular order
    labels = np.array([g for g in range(4) for _ in range(3)])[order]
    U = np.array([directions[g] for g in labels])
    U += noise * rng.standard_normal(U.shape) / np.sqrt(DIM)
    return U, labels


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("noise", [0.05, 0.2, 0.4])
def test_four_group_hierarchy_forms(noise, seed):
    U, labels = _four_groups(noise, seed)
    a, b = bipartition(cosine_similarity_matrix(U))
    # first level: pairs of groups
    assert {frozenset(labels[a]), frozenset(labels[b])} == {frozenset({0, 1}), frozenset({2, 3})}
    top = correct_clustering_check(U, a, b)
    assert top.passed, top
    # second level: each side into its two groups, on the side's own rows
    for side in (a, b):
        sub = U[side]
        sa, sb = bipartition(cosine_similarity_matrix(sub))
        groups_a, groups_b = set(labels[side][sa]), set(labels[side][sb])
        assert len(groups_a) == len(groups_b) == 1 and groups_a != groups_b
        res = correct_clustering_check(sub, sa, sb)
        assert res.passed, res
        assert res.alpha_cross_max == pytest.approx(0.3, abs=0.1)


def test_side_mean_estimator_would_veto_the_top_level():
    """Why the default is nearest_peer: a side holding two groups has a mean that is no
    client's true gradient, so side-mean γ ≈ 1 > sqrt(1/2) even for a perfect split."""
    U, labels = _four_groups(0.05, seed=0, pair_similarity=0.0)
    a = np.flatnonzero(np.isin(labels, [0, 1]))
    b = np.flatnonzero(np.isin(labels, [2, 3]))
    assert correct_clustering_check(U, a, b).passed
    side_mean = correct_clustering_check(U, a, b, estimator="side_mean")
    assert not side_mean.passed
    assert side_mean.gamma_max == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("noise", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("m", [6, 12])
def test_homogeneous_group_split_fails(noise, seed, m):
    rng = np.random.default_rng(seed)
    direction = np.eye(DIM)[7]
    U = direction + noise * rng.standard_normal((m, DIM)) / np.sqrt(DIM)
    a, b = bipartition(cosine_similarity_matrix(U))
    res = correct_clustering_check(U, a, b)
    assert not res.passed, res


def test_check_values_on_exact_groups():
    # two exact groups: nearest peer identical (γ = 0), cross cosine 0.6
    u = np.array([1.0, 0.0])
    v = np.array([0.6, 0.8])
    U = np.array([u, u, v, 2 * v])
    res = correct_clustering_check(U, [0, 1], [2, 3])
    assert res.passed
    assert res.alpha_cross_max == pytest.approx(0.6)
    assert res.gamma_max == pytest.approx(0.0, abs=1e-7)
    assert res.bound == pytest.approx(np.sqrt(0.2))


def test_gamma_from_nearest_peer_by_hand():
    # peers at cos 0.8: γ = sqrt(1/0.8 − 1) = 0.5; bound with cross cos 0 is sqrt(0.5)
    U = np.array([[1.0, 0, 0, 0], [0.8, 0.6, 0, 0], [0, 0, 1.0, 0], [0, 0, 0.8, 0.6]])
    gammas = estimate_gammas(U, [0, 1], [2, 3])
    np.testing.assert_allclose(gammas, [0.5, 0.5, 0.5, 0.5])
    res = correct_clustering_check(U, [0, 1], [2, 3])
    assert res.passed and res.gamma_max == pytest.approx(0.5)
    # peers at cos 0.6: γ = sqrt(2/3) ≈ 0.816 > sqrt(0.5): fails
    U[1] = [0.6, 0.8, 0, 0]
    assert not correct_clustering_check(U, [0, 1], [2, 3]).passed


def test_singletons():
    U = np.array([[1.0, 0, 0], [0.8, 0.6, 0], [0, 0, 1.0]])
    # the lone client takes the largest γ of the clients with a peer
    gammas = estimate_gammas(U, [0, 1], [2])
    np.testing.assert_allclose(gammas, [0.5, 0.5, 0.5])
    assert correct_clustering_check(U, [0, 1], [2]).passed
    # two singletons: nothing to measure noise with, the check cannot pass
    res = correct_clustering_check(U[[0, 2]], [0], [1])
    assert not res.passed and np.isinf(res.gamma_max)
    # a client pointing away from its only peer: γ = ∞
    V = np.array([[1.0, 0, 0], [-1.0, 0.1, 0], [0, 0, 1.0], [0, 0.1, 1.0]])
    assert np.isinf(correct_clustering_check(V, [0, 1], [2, 3]).gamma_max)
    with pytest.raises(ValueError):
        correct_clustering_check(U, [0, 1, 2], [])
    with pytest.raises(ValueError):
        correct_clustering_check(U, [0], [1], estimator="bogus")


def test_true_group_gap():
    S = np.array(
        [
            [1.0, 0.9, 0.1, 0.0],
            [0.9, 1.0, 0.2, 0.3],
            [0.1, 0.2, 1.0, 0.8],
            [0.0, 0.3, 0.8, 1.0],
        ]
    )
    assert true_group_gap(S, ["x", "x", "y", "y"]) == pytest.approx(0.8 - 0.3)
    assert true_group_gap(S, [0, 1, 0, 1]) == pytest.approx(0.1 - 0.9)  # pairs (0,2), (1,3)
    # singleton groups contribute no same-group pair
    assert true_group_gap(S, [0, 0, 1, 2]) == pytest.approx(0.9 - 0.8)
    assert true_group_gap(S[:2, :2], [0, 1]) == pytest.approx(1.0 - 0.9)
    assert np.isnan(true_group_gap(S, [5, 5, 5, 5]))
    with pytest.raises(ValueError):
        true_group_gap(S, [0, 1])


def test_true_group_gap_on_four_groups_is_positive():
    U, labels = _four_groups(0.1, seed=3)
    assert true_group_gap(cosine_similarity_matrix(U), labels) > 0.5
