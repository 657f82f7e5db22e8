import math

import numpy as np
import pytest

from clusterfed.clustering.newcomers import cluster_references, default_epsilon, nearest_cluster, place_newcomer


def refs_3():
    X = np.array([[0.0, 0.0], [0.0, 2.0], [10.0, 0.0], [10.0, 2.0], [0.0, 20.0]])
    return cluster_references(X, np.array([0, 0, 1, 1, 2]))


def test_cluster_references_are_member_means():
    refs = refs_3()
    assert sorted(refs) == [0, 1, 2]
    assert refs[0].tolist() == [0.0, 1.0]
    assert refs[1].tolist() == [10.0, 1.0]
    assert refs[2].tolist() == [0.0, 20.0]
    with pytest.raises(ValueError):
        cluster_references(np.zeros((2, 2)), np.array([0]))


def test_nearest_cluster():
    refs = refs_3()
    assert nearest_cluster(np.array([9.0, 1.0]), refs) == (1, pytest.approx(1.0))
    assert nearest_cluster(np.array([1.0, 18.0]), refs)[0] == 2
    # Tie: lowest cluster id.
    assert nearest_cluster(np.array([5.0, 1.0]), refs)[0] == 0
    # Cosine: direction decides, not length.
    x = np.array([1.0, 0.05])
    assert nearest_cluster(x, refs)[0] == 0
    assert nearest_cluster(x, refs, metric="cosine")[0] == 1
    with pytest.raises(ValueError):
        nearest_cluster(np.zeros(2), {})
    with pytest.raises(ValueError):
        nearest_cluster(np.zeros(3), refs)


def test_default_epsilon_is_largest_reference_distance():
    refs = refs_3()
    assert default_epsilon(refs) == pytest.approx(math.hypot(10.0, 19.0))
    assert default_epsilon({4: np.ones(2)}) == math.inf
    assert default_epsilon({}) == math.inf


def test_place_newcomer_joins_nearest_or_founds_new_cluster():
    refs = refs_3()
    assert place_newcomer(np.array([9.5, 1.5]), refs) == (1, pytest.approx(math.hypot(0.5, 0.5)))
    far = np.array([100.0, 100.0])
    cid, dist = place_newcomer(far, refs)  # beyond default ε = max reference distance
    assert cid is None and dist > default_epsilon(refs)
    assert place_newcomer(far, refs, epsilon=math.inf)[0] == 2  # FedClust: never a new one
    assert place_newcomer(np.array([0.0, 4.0]), refs, epsilon=2.5)[0] is None
    assert place_newcomer(np.array([0.0, 3.0]), refs, epsilon=2.0)[0] == 0  # distance == ε joins
    assert place_newcomer(far, {3: np.zeros(2)})[0] == 3  # one reference: ε = inf
    assert place_newcomer(far, {}) == (None, math.inf)
