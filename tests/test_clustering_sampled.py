"""Two-stage clustering: full method on a seeded sample, nearest reference for the rest."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering.agglomerative import cluster_auto, cluster_by_threshold, relabel_in_order
from clusterfed.clustering.distances import distances_to
from clusterfed.clustering.sampled import cluster_sampled


def blobs(seed=0, dim=12, sizes=(300, 200, 150, 100), spread=1.0, separation=50.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(sizes), dim))
    centers *= separation / np.linalg.norm(centers, axis=1, keepdims=True)
    truth = np.concatenate([np.full(n, g) for g, n in enumerate(sizes)])
    truth = truth[rng.permutation(truth.size)]
    X = centers[truth] + spread * rng.normal(size=(truth.size, dim))
    return X, truth, centers


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("threshold", ["auto", "lambda"])
def test_sample_recovers_well_separated_groups_and_places_every_row(metric, threshold):
    X, truth, _ = blobs(seed=1)
    lam = {"l2": 20.0, "cosine": 0.3}[metric]
    res = cluster_sampled(X, 60, seed=3, metric=metric, threshold="auto" if threshold == "auto" else lam)
    assert res.labels.shape == (len(X),) and res.labels.dtype.kind == "i"
    assert res.num_clusters == 4
    assert np.array_equal(res.labels, relabel_in_order(truth))  # exact, numbered by first appearance
    assert res.sample.size == 60 and np.all(np.diff(res.sample) > 0)
    # references: means of the *sampled* members, row c = cluster c
    for c in range(res.num_clusters):
        members = res.sample[res.labels[res.sample] == c]
        assert np.allclose(res.references[c], X[members].mean(axis=0))
    # every row's distance is the one to its own cluster's reference
    for i in (0, 7, 500, len(X) - 1):
        assert res.distances[i] == pytest.approx(distances_to(X[i], res.references, metric)[res.labels[i]], abs=1e-6)
    if threshold == "auto":
        assert res.silhouette > 0.5 and 4 in res.scores
    else:
        assert res.threshold == lam and res.silhouette is None


def test_same_seed_same_result_and_float32_memmap(tmp_path):
    X, truth, _ = blobs(seed=2)
    a = cluster_sampled(X, 80, seed=5)
    b = cluster_sampled(X, 80, seed=5)
    assert np.array_equal(a.sample, b.sample) and np.array_equal(a.labels, b.labels)
    path = tmp_path / "x.f32"
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=X.shape)
    mm[:] = X
    mm.flush()
    c = cluster_sampled(np.memmap(path, dtype=np.float32, mode="r", shape=X.shape), 80, seed=5, chunk_rows=97)
    assert np.array_equal(c.sample, a.sample)
    assert adjusted_rand_score(truth, c.labels) == 1.0


def test_tiny_group_missing_from_the_sample_joins_its_nearest_cluster():
    """Documented behaviour: no new cluster is founded (ε = inf); the tiny group's rows are
    placed with the nearest reference."""
    rng = np.random.default_rng(7)
    dim = 5
    a = rng.normal(size=(200, dim))                 # group A around 0
    b = rng.normal(size=(200, dim)) + 40.0          # group B around (40, ..., 40)
    tiny = rng.normal(size=(3, dim)) * 0.1 + 30.0   # tiny group T, nearer to B than to A
    X = np.vstack([a, b, tiny])
    t_rows = np.arange(400, 403)
    for seed in range(100):  # a seed whose sample misses T (probability ~0.93 each)
        res = cluster_sampled(X, 10, seed=seed)
        if not np.isin(t_rows, res.sample).any():
            break
    else:
        pytest.fail("no seed missed the tiny group")
    assert res.num_clusters == 2
    assert adjusted_rand_score(np.repeat([0, 1], 200), res.labels[:400]) == 1.0
    b_label = res.labels[200]
    assert np.all(res.labels[t_rows] == b_label)
    assert np.allclose(res.distances[t_rows], np.linalg.norm(X[t_rows] - res.references[b_label], axis=1))


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_sample_covering_everyone_is_the_full_clustering(metric):
    X, _, _ = blobs(seed=4, sizes=(12, 9, 7))
    full = cluster_auto(X, metric=metric, distances="blocked")
    for size in (0, len(X), len(X) + 5):
        res = cluster_sampled(X, size, metric=metric)
        assert np.array_equal(res.sample, np.arange(len(X)))
        assert np.array_equal(res.labels, full.labels)
        assert res.threshold == full.threshold and res.num_clusters == full.num_clusters
    lam = full.threshold
    assert np.array_equal(
        cluster_sampled(X, 0, metric=metric, threshold=lam).labels, cluster_by_threshold(X, lam, metric=metric)
    )


def test_validation():
    X, _, _ = blobs(seed=5, sizes=(5, 5))
    with pytest.raises(ValueError):
        cluster_sampled(X, -1)
    with pytest.raises(ValueError):
        cluster_sampled(X, 4, threshold="best")
    with pytest.raises(ValueError):
        cluster_sampled(X, 4, distances="exact")
    with pytest.raises(ValueError):
        cluster_sampled(X, 4, metric="manhattan")
    with pytest.raises(ValueError):
        cluster_sampled(X, 4, metric="cosine", linkage="ward")
    with pytest.raises(ValueError):
        cluster_sampled(X[0], 4)
    with pytest.raises(ValueError):
        cluster_sampled(np.zeros((0, 3)), 4)
    bad = X.copy()
    bad[-1, 0] = np.nan  # found in the sample or while placing, whichever holds it
    with pytest.raises(ValueError):
        cluster_sampled(bad, 4, seed=0)
    one = cluster_sampled(X[:1], 5)
    assert one.labels.tolist() == [0] and one.num_clusters == 1
