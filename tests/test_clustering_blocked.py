"""Blocked matrix-product distances and the dendrogram functions on them."""

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering.agglomerative import LINKAGES, cluster_auto, cluster_by_threshold, cluster_into_k, linkage_matrix
from clusterfed.clustering.distances import blocked_pairwise_distances, condensed_distances, pairwise_distances
from clusterfed.clustering.newcomers import nearest_cluster, nearest_references

# blocked cosine distances: float32 products of unit rows, within this of pdist
COSINE_TOL = 2e-6


def groups(seed=0, dim=30, sizes=(40, 25, 9, 16), spread=2.0, separation=60.0, offset=500.0):
    """Well-separated groups around a large common offset (like weights near a shared model)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(sizes), dim))
    centers *= separation / np.linalg.norm(centers, axis=1, keepdims=True)
    truth = np.concatenate([np.full(n, g) for g, n in enumerate(sizes)])
    truth = truth[rng.permutation(truth.size)]
    X = offset + centers[truth] + spread * rng.normal(size=(truth.size, dim))
    return X, truth


@pytest.mark.parametrize("block_rows", [1, 3, 7, 64, 1000])
def test_blocked_l2_equals_pdist(block_rows):
    rng = np.random.default_rng(1)
    X = 1000.0 + 3.0 * rng.normal(size=(67, 19))  # odd sizes, a large mean
    X[5] = X[2]  # a duplicate row: distance 0 where cancellation is worst
    got = blocked_pairwise_distances(X, "l2", block_rows=block_rows)
    ref = pdist(X, "euclidean")
    assert got.shape == ref.shape
    scale = np.linalg.norm(X - X.mean(axis=0), axis=1).max()
    assert np.max(np.abs(got - ref)) <= 1e-6 * scale  # the stated tolerance
    far = ref > 0.1 * scale
    assert np.allclose(got[far], ref[far], rtol=1e-10, atol=0)


@pytest.mark.parametrize("block_rows", [1, 4, 9, 1000])
def test_blocked_cosine_equals_pdist_and_zero_rule(block_rows):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(41, 13))
    X[[3, 17]] = 0.0  # zero rows: distance 1 to everything, each other included
    got = blocked_pairwise_distances(X, "cosine", block_rows=block_rows)
    assert np.max(np.abs(got - pairwise_distances(X, "cosine"))) <= COSINE_TOL
    Y = np.delete(X, [3, 17], axis=0)
    assert np.max(np.abs(blocked_pairwise_distances(Y, "cosine", block_rows=block_rows) - pdist(Y, "cosine"))) <= COSINE_TOL


def test_blocked_small_inputs_and_validation():
    assert blocked_pairwise_distances(np.ones((1, 3))).size == 0
    assert blocked_pairwise_distances(np.array([[0.0, 0.0], [3.0, 4.0]])).tolist() == [5.0]
    with pytest.raises(ValueError):
        blocked_pairwise_distances(np.ones((3, 2)), block_rows=0)
    with pytest.raises(ValueError):
        blocked_pairwise_distances(np.ones((3, 2)), "manhattan")
    with pytest.raises(ValueError):
        blocked_pairwise_distances(np.array([[0.0, np.nan], [1.0, 1.0]]))
    with pytest.raises(ValueError):
        condensed_distances(np.ones((3, 2)), "l2", "exact")
    for fn in (cluster_auto, lambda X, **kw: cluster_by_threshold(X, 1.0, **kw), lambda X, **kw: cluster_into_k(X, 1, **kw)):
        with pytest.raises(ValueError):
            fn(np.ones((1, 2)), distances="exact")  # checked even when one client needs no distances


@pytest.mark.parametrize("linkage", LINKAGES)
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_blocked_dendrogram_gives_the_same_clustering(linkage, metric):
    if linkage == "ward" and metric == "cosine":
        pytest.skip("ward needs l2")
    X, truth = groups(seed=3, offset=0.0 if metric == "cosine" else 500.0)
    fast = cluster_auto(X, metric=metric, linkage=linkage, distances="blocked")
    slow = cluster_auto(X, metric=metric, linkage=linkage)
    assert fast.num_clusters == slow.num_clusters == 4
    assert np.array_equal(fast.labels, slow.labels)
    assert adjusted_rand_score(truth, fast.labels) == 1.0
    tol = COSINE_TOL if metric == "cosine" else 1e-9  # cosine products run in float32
    assert fast.threshold == pytest.approx(slow.threshold, rel=tol, abs=tol)
    assert fast.silhouette == pytest.approx(slow.silhouette, rel=tol, abs=tol)
    assert np.allclose(
        linkage_matrix(X, metric=metric, linkage=linkage, distances="blocked"),
        linkage_matrix(X, metric=metric, linkage=linkage),
        rtol=tol,
        atol=tol,
    )
    lam = slow.threshold
    assert np.array_equal(
        cluster_by_threshold(X, lam, metric=metric, linkage=linkage, distances="blocked"),
        cluster_by_threshold(X, lam, metric=metric, linkage=linkage),
    )
    assert np.array_equal(
        cluster_into_k(X, 4, metric=metric, linkage=linkage, distances="blocked"), slow.labels
    )


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("chunk_rows", [1, 5, 1000])
def test_nearest_references_matches_nearest_cluster(metric, chunk_rows):
    rng = np.random.default_rng(4)
    R = rng.normal(size=(5, 8)) * 10
    R[4] = 0.0  # a zero reference: cosine distance 1
    X = rng.normal(size=(23, 8)) * 10
    X[7] = 0.0  # a zero row: cosine ties everywhere -> lowest index
    refs = {g: R[g] for g in range(5)}
    idx, dist = nearest_references(X.astype(np.float32), R, metric, chunk_rows=chunk_rows)
    # stated tolerance: 1e-6 × the largest norm about the references' mean (x7 = r4 = 0 in L2)
    scale = np.linalg.norm(np.vstack([X, R]) - R.mean(axis=0), axis=1).max()
    for i, x in enumerate(X.astype(np.float32)):
        g, d = nearest_cluster(x, refs, metric)
        assert idx[i] == g
        assert dist[i] == pytest.approx(d, rel=1e-9, abs=1e-6 * scale)
    if metric == "cosine":
        assert idx[7] == 0 and dist[7] == 1.0


def test_nearest_references_validation():
    R = np.zeros((2, 3))
    with pytest.raises(ValueError):
        nearest_references(np.zeros((4, 2)), R)
    with pytest.raises(ValueError):
        nearest_references(np.array([[0.0, np.inf, 0.0]]), R)
    with pytest.raises(ValueError):
        nearest_references(np.zeros((4, 3)), R, chunk_rows=0)
