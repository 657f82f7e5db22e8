"""The group-free reference that lowers a silhouette threshold for many small, noisy clients."""

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering.agglomerative import cluster_auto
from clusterfed.clustering.null_reference import (
    reference_draws,
    reference_score,
    complement_of_ones,
    haar_orthogonal,
    span_coordinates,
    structure_threshold,
)


def groups_in_noise(separation: float, m: int = 200, d: int = 2000, k: int = 8, seed: int = 1):
    """k equal groups whose centres are ``separation`` × N(0, I) away from each other, with
    N(0, I) noise per member: many clients, each one noisy (weak but real groups)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * separation
    groups = np.repeat(np.arange(k), m // k)
    return centres[groups] + rng.standard_normal((m, d)), groups


def test_span_coordinates_keep_l2_and_cosine_distances():
    X = np.random.default_rng(0).standard_normal((12, 300))
    C = span_coordinates(X)
    assert C.shape == (12, 12)
    for metric in ("euclidean", "cosine"):
        np.testing.assert_allclose(pdist(C, metric), pdist(X, metric), rtol=1e-9, atol=1e-9)


def test_reference_draws_have_the_data_shape_and_are_seeded():
    X = np.random.default_rng(0).standard_normal((30, 100)) + 5.0
    a, b = reference_draws(X, 3, seed=4), reference_draws(X, 3, seed=4)
    assert len(a) == 3 and a[0].shape == (30, 30)
    np.testing.assert_array_equal(a[1], b[1])
    assert reference_draws(np.zeros((800, 5)) + 1.0, 1, seed=0, max_rows=600)[0].shape[0] == 600


def test_weak_real_groups_are_found_below_the_fixed_threshold():
    X, groups = groups_in_noise(0.5)
    fixed_only = cluster_auto(X, metric="cosine", min_silhouette=0.25)
    assert fixed_only.num_clusters == 1 and fixed_only.silhouette < 0.25  # today's threshold misses them
    cut = cluster_auto(X, metric="cosine", min_silhouette=0.25, reference_draws=19)
    assert cut.reference is not None and cut.silhouette > cut.reference
    assert cut.required == pytest.approx(cut.reference)
    assert adjusted_rand_score(groups, cut.labels) == pytest.approx(1.0)


@pytest.mark.end_to_end
def test_noise_of_the_same_size_stays_one_cluster():
    X, _ = groups_in_noise(0.0)
    cut = cluster_auto(X, metric="cosine", min_silhouette=0.25, reference_draws=19)
    assert cut.num_clusters == 1
    assert cut.silhouette <= cut.reference


def test_a_cut_that_passes_the_fixed_threshold_is_not_touched():
    X, groups = groups_in_noise(1.0, m=40, d=200, k=4)
    plain = cluster_auto(X, metric="cosine")
    with_reference = cluster_auto(X, metric="cosine", reference_draws=19)
    assert plain.silhouette >= 0.25 and with_reference.reference is None
    np.testing.assert_array_equal(plain.labels, with_reference.labels)


def test_the_threshold_is_only_ever_lowered():
    assert structure_threshold(0.25, None) == 0.25
    assert structure_threshold(0.25, 0.07) == 0.07
    assert structure_threshold(0.25, 0.4) == 0.25
    assert reference_score(np.ones((2, 5)), lambda R: 1.0) is None


# ----------------------------------------------------------- a few clients
def few_clients(m: int, separation: float, seed: int, d: int = 850):
    """m update rows of d coordinates: a direction every client shares (norm 1), isotropic
    noise of total variance 1, and (separation > 0) three equal groups whose centres are
    ``separation`` away from that direction: every within-group distance below every
    between-group one, yet the noise keeps the silhouette below 0.25."""
    rng = np.random.default_rng(seed)
    groups = np.arange(m) % 3
    centres = rng.standard_normal((3, d))
    centres *= separation / np.linalg.norm(centres, axis=1, keepdims=True)
    return rng.standard_normal((m, d)) / np.sqrt(d) + 1.0 / np.sqrt(d) + centres[groups], groups


def test_a_rotation_about_the_mean_keeps_the_mean_and_the_distances_spectrum():
    Q, B = haar_orthogonal(8, np.random.default_rng(3)), complement_of_ones(9)
    np.testing.assert_allclose(Q @ Q.T, np.eye(8), atol=1e-12)
    np.testing.assert_allclose(B.T @ B, np.eye(8), atol=1e-12)
    np.testing.assert_allclose(B.T @ np.ones(9), np.zeros(8), atol=1e-12)
    X, _ = few_clients(9, 0.5, seed=0)
    (R,) = reference_draws(X, 1, seed=5, method="rotation")
    C = span_coordinates(X)
    np.testing.assert_allclose(R.mean(axis=0), C.mean(axis=0), atol=1e-12)
    gram = lambda A: np.linalg.eigvalsh((A - A.mean(0)) @ (A - A.mean(0)).T)  # noqa: E731
    np.testing.assert_allclose(gram(R), gram(C), atol=1e-9)
    with pytest.raises(ValueError, match="unknown reference method"):
        reference_draws(X, 1, seed=0, method="uniform")


def test_clear_groups_of_nine_clients_are_cut_though_their_silhouette_is_below_the_threshold():
    X, groups = few_clients(9, 0.5, seed=0)
    fixed_only = cluster_auto(X, metric="cosine")
    assert fixed_only.num_clusters == 1 and fixed_only.silhouette < 0.25
    # Gaussian draws in the rows' 8-dimensional span clump by chance: that reference vetoes
    gaussian = cluster_auto(X, metric="cosine", reference_draws=19, reference_method="gaussian")
    assert gaussian.num_clusters == 1 and gaussian.reference > 0.25
    cut = cluster_auto(X, metric="cosine", reference_draws=19)  # the rotation reference, the default
    assert cut.reference < cut.silhouette < 0.25
    assert adjusted_rand_score(groups, cut.labels) == 1.0


def test_group_free_nine_clients_are_mostly_left_as_one_cluster():
    splits = sum(cluster_auto(few_clients(9, 0.0, seed=seed)[0], metric="cosine", reference_draws=19,
                              seed=seed).num_clusters > 1 for seed in range(40))
    assert splits <= 4  # a 5 % test: about 2 of 40


def test_a_ranked_reference_keeps_its_level_when_draws_cannot_be_scored():
    """The rank-th largest of the draws scored, the rank lowered with the draws lost (half of 99
    draws scored: the 2nd largest, not the 5th); a rank below 1 is refused before any draw."""
    X = np.random.default_rng(0).normal(size=(6, 40))
    calls = iter(range(10_000))
    every_other = lambda R: None if next(calls) % 2 else float(R[0, 0])  # noqa: E731
    scored = [float(R[0, 0]) for i, R in enumerate(reference_draws(X, 99, 3, method="rotation")) if i % 2 == 0]
    kept = reference_score(X, every_other, draws=99, seed=3, method="rotation", rank=5)
    assert kept == sorted(scored, reverse=True)[1]
    with pytest.raises(ValueError, match="rank must be 1 or more"):
        reference_score(X, every_other, draws=99, seed=3, rank=0)
