import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering.agglomerative import cluster_by_threshold
from clusterfed.clustering.entropy import (
    cluster_within_preclusters,
    entropy_preclusters,
    label_entropy,
    num_classes_present,
)


def test_label_entropy_known_values():
    assert label_entropy([5, 5, 5, 5]) == pytest.approx(2.0)  # uniform over 4: 2 bits
    assert label_entropy({3: 10, 7: 10}) == pytest.approx(1.0)
    assert label_entropy([5, 0, 0, 5]) == pytest.approx(1.0)  # empty classes ignored
    assert label_entropy([0, 9, 0]) == 0.0
    assert label_entropy([0, 0]) == 0.0
    assert label_entropy([]) == 0.0
    assert label_entropy([3, 1]) == pytest.approx(-(0.75 * np.log2(0.75) + 0.25 * np.log2(0.25)))
    with pytest.raises(ValueError):
        label_entropy([1, -1])


def test_num_classes_present():
    assert num_classes_present([3, 0, 1, 0]) == 2
    assert num_classes_present({"a": 0}) == 0
    assert num_classes_present(np.array([1.0, 2.0, 3.0])) == 3


def test_preclusters_made_up_example():
    L = [2, 2, 2, 2, 3, 3, 1, 1]
    s = [1.0, 1.05, 1.2, 0.5, 1.5, 1.58, 0.0, 0.0]
    # L=1: {0, 0} -> id 0. L=2 sorted 0.5 | 1.0, 1.05 (<= 1.1) | 1.2 (> 1.1) -> ids 1, 2, 3.
    # L=3: 1.5, 1.58 (<= 1.65) -> id 4.
    assert entropy_preclusters(L, s, gap=0.1).tolist() == [2, 2, 3, 1, 4, 4, 0, 0]


def test_preclusters_compare_with_first_member_not_previous():
    # Each step is < 10 %, but 1.18 is > 10 % above the first member 1.0.
    assert entropy_preclusters([4, 4, 4], [1.0, 1.09, 1.18]).tolist() == [0, 0, 1]
    assert entropy_preclusters([4, 4, 4], [1.0, 1.09, 1.18], gap=0.5).tolist() == [0, 0, 0]


def test_preclusters_first_entropy_zero_and_gap_zero():
    # Consistent stats: L=1 means entropy 0 for everyone -> one pre-cluster.
    assert entropy_preclusters([1, 1, 1], [0.0, 0.0, 0.0]).tolist() == [0, 0, 0]
    # Literal rule with first == 0: any positive entropy starts a new pre-cluster.
    assert entropy_preclusters([2, 2, 2], [0.0, 0.01, 0.0]).tolist() == [0, 1, 0]
    # gap 0: every distinct entropy is its own pre-cluster, equal ones stay together.
    assert entropy_preclusters([2, 2, 2], [1.0, 0.9, 1.0], gap=0.0).tolist() == [1, 0, 1]


def test_preclusters_validation():
    with pytest.raises(ValueError):
        entropy_preclusters([1, 2], [0.0])
    with pytest.raises(ValueError):
        entropy_preclusters([1], [0.0], gap=-0.1)
    with pytest.raises(ValueError):
        entropy_preclusters([1], [float("nan")])
    assert entropy_preclusters([], []).tolist() == []


def blobs_with_preclusters():
    a, b = np.zeros(4), np.full(4, 10.0)
    jitter = np.random.default_rng(0).normal(scale=0.1, size=(7, 4))
    # pre-cluster 0: two blobs; pre-cluster 1: blob a again; pre-cluster 2: one client.
    X = np.vstack([a, b, a, b, a, a, b]) + jitter
    pre = np.array([0, 0, 0, 0, 1, 1, 2])
    return X, pre


def test_cluster_within_preclusters_threshold():
    X, pre = blobs_with_preclusters()
    labels = cluster_within_preclusters(X, pre, 1.0)
    # Blob a in pre-cluster 0 and in pre-cluster 1 are different clusters: union, not merge.
    assert labels.tolist() == [0, 1, 0, 1, 2, 2, 3]
    # Without pre-clusters the same λ gives the two blobs only.
    assert cluster_by_threshold(X, 1.0).max() + 1 == 2


def test_cluster_within_preclusters_auto_reports_cuts():
    X, pre = blobs_with_preclusters()
    labels, cuts = cluster_within_preclusters(X, pre, "auto", return_cuts=True)
    assert labels.tolist() == [0, 1, 0, 1, 2, 2, 3]
    assert set(cuts) == {0, 1, 2}
    assert cuts[0].num_clusters == 2 and cuts[0].silhouette > 0.9
    assert np.array_equal(cluster_by_threshold(X[pre == 0], cuts[0].threshold), cuts[0].labels)
    assert cuts[1].num_clusters == 1 and cuts[2].num_clusters == 1  # too small to split
    _, fixed = cluster_within_preclusters(X, pre, 1.0, return_cuts=True)
    assert fixed[0].threshold == 1.0 and fixed[0].silhouette is None


def test_cluster_within_preclusters_order_invariant_and_validation():
    X, pre = blobs_with_preclusters()
    perm = np.array([6, 3, 0, 5, 1, 4, 2])
    inv = np.argsort(perm)
    for how in (1.0, "auto"):
        a = cluster_within_preclusters(X, pre, how)
        b = cluster_within_preclusters(X[perm], pre[perm], how)[inv]
        assert adjusted_rand_score(a, b) == 1.0
    with pytest.raises(ValueError):
        cluster_within_preclusters(X, pre[:3], 1.0)
    with pytest.raises(ValueError):
        cluster_within_preclusters(X, pre, "automatic")
