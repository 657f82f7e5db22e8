import numpy as np
import pytest
from scipy.spatial.distance import squareform

from clusterfed.clustering.distances import (
    distance_matrix,
    distances_to,
    flatten_partial,
    pairwise_distances,
    stack_partials,
)


def test_flatten_partial_keeps_order_and_dtype():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10, 11], dtype=np.int64)
    assert flatten_partial([w, b]).tolist() == [0, 1, 2, 3, 4, 5, 10, 11]
    assert flatten_partial({"fc.bias": b, "fc.weight": w}).tolist() == [10, 11, 0, 1, 2, 3, 4, 5]
    assert flatten_partial([w, b]).dtype == np.float64
    assert flatten_partial([]).shape == (0,)


def test_stack_partials_rows_are_clients():
    parts = [{"w": np.full((2, 2), c), "b": np.array([c])} for c in range(3)]
    X = stack_partials(parts)
    assert X.shape == (3, 5)
    assert X[2].tolist() == [2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="differ in size"):
        stack_partials([[np.zeros(3)], [np.zeros(4)]])


def test_l2_distances_known_values():
    X = np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]])
    assert np.allclose(pairwise_distances(X, "l2"), [5.0, 10.0, 5.0])
    D = distance_matrix(X, "l2")
    assert D.shape == (3, 3)
    assert np.allclose(D, D.T) and np.all(np.diag(D) == 0)
    assert D[0, 2] == pytest.approx(10.0)


def test_cosine_distances_known_values():
    X = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [2.0, 2.0]])
    D = distance_matrix(X, "cosine")
    assert D[0, 1] == pytest.approx(1.0)  # orthogonal
    assert D[0, 2] == pytest.approx(2.0)  # opposite
    assert D[0, 3] == pytest.approx(1 - np.sqrt(0.5))
    assert np.all(D >= 0)


def test_cosine_with_zero_vector_is_one_not_nan():
    X = np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
    D = distance_matrix(X, "cosine")
    assert not np.any(np.isnan(D))
    assert D[0, 2] == pytest.approx(0.0)
    for i in range(4):
        for j in (1, 3):
            if i != j:
                assert D[i, j] == 1.0
    assert distances_to(np.zeros(2), X, "cosine").tolist() == [1, 1, 1, 1]
    assert distances_to(np.array([1.0, 0.0]), X, "cosine")[[1, 3]].tolist() == [1, 1]


def test_cosine_zero_rows_many_clients_condensed_indexing():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5))
    X[[0, 17, 39]] = 0.0
    D = squareform(pairwise_distances(X, "cosine"))
    ref = 1 - (X @ X.T) / np.outer(np.linalg.norm(X, axis=1), np.linalg.norm(X, axis=1)).clip(1e-300)
    zero = np.zeros(40, bool)
    zero[[0, 17, 39]] = True
    ref[zero, :] = 1.0
    ref[:, zero] = 1.0
    np.fill_diagonal(ref, 0.0)
    assert np.allclose(D, ref)


def test_unknown_metric_and_bad_input():
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="unknown distance metric"):
        pairwise_distances(X, "manhattan")
    with pytest.raises(ValueError, match="NaN"):
        pairwise_distances(np.array([[0.0, np.nan], [1.0, 1.0]]))
    with pytest.raises(ValueError):
        pairwise_distances(np.zeros(3))


def test_single_client():
    assert pairwise_distances(np.ones((1, 4))).shape == (0,)
    assert distance_matrix(np.ones((1, 4))).tolist() == [[0.0]]
