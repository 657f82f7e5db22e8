"""clustering.reproducible: partitions found on independent evidence, compared by ARI."""

import numpy as np
import pytest

from clusterfed.clustering import cluster_into_k
from clusterfed.clustering.reproducible import agreement, compare, compare_pairs, coordinate_halves, cut_halves


def test_agreement_is_one_for_the_same_partition_under_other_names():
    assert agreement([0, 0, 1, 1, 2], [2, 2, 0, 0, 1]) == pytest.approx(1.0)
    assert agreement([0, 0, 0], [0, 0, 0]) == pytest.approx(1.0)
    assert agreement([0, 0, 1, 1], [0, 1, 0, 1]) < 0


def test_partitions_of_different_clients_are_refused():
    with pytest.raises(ValueError, match="3 and 2 clients"):
        agreement([0, 1, 1], [0, 1])


def test_coordinate_halves_are_disjoint_and_cover_every_column():
    a, b = coordinate_halves(11, np.random.default_rng(0))
    assert len(a) == 5 and len(b) == 6
    assert sorted(np.concatenate([a, b]).tolist()) == list(range(11))
    with pytest.raises(ValueError):
        coordinate_halves(1, np.random.default_rng(0))


def two_groups(noise: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(2, 400))
    return np.repeat(centres, 6, axis=0) + noise * rng.normal(size=(12, 400))


def cut2(X):
    return cluster_into_k(X, 2, metric="cosine")


def test_groups_spread_over_the_coordinates_reproduce_on_both_halves():
    found = cut_halves(two_groups(0.3), cut2, np.random.default_rng(1))
    assert found.reproduces(0.9)
    assert found.clusters() == (2, 2)
    assert found.words(0.9) == "coordinate halves agree (ARI 1.00)"


def test_a_cut_of_noise_does_not_reproduce():
    rng = np.random.default_rng(3)
    found = cut_halves(rng.normal(size=(12, 400)), cut2, np.random.default_rng(4))
    assert not found.reproduces(0.8)
    assert "disagree" in found.words(0.8) and "< 0.80" in found.words(0.8)


def test_compare_names_its_source_and_records_plain_values():
    found = compare([0, 0, 1, 1], [0, 0, 1, 0], "requests 1–5 and 6–10")
    record = found.as_record()
    assert record["source"] == "requests 1–5 and 6–10" and record["clusters"] == [2, 2]
    assert isinstance(record["agreement"], float) and record["agreement"] < 0.8


def test_pair_agreement_is_the_adjusted_rand_index_on_all_pairs_and_kappa_on_some():
    """Over all pairs of two partitions, the pairs' agreement is their ARI (Warrens 2008); the
    same judgements on a subset of pairs are still compared, and constant judgements agree
    only when equal."""
    from itertools import combinations

    from sklearn.metrics import adjusted_rand_score

    a, b = [0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 1, 1, 2, 2]
    pairs = list(combinations(range(len(a)), 2))
    together_a, together_b = [a[i] == a[j] for i, j in pairs], [b[i] == b[j] for i, j in pairs]
    whole = compare_pairs(together_a, together_b, "pairs")
    assert whole.agreement == pytest.approx(adjusted_rand_score(a, b))
    assert whole.as_record() == {"source": "pairs", "agreement": round(whole.agreement, 4), "pairs": 21}
    assert "pair ARI" in whole.words(0.8) and "over 21 pairs" in whole.words(0.8)
    assert compare_pairs([True, False, True], [True, False, True], "s").agreement == 1.0
    assert compare_pairs([False, False], [False, False], "s").agreement == 1.0
    assert compare_pairs([False, False], [True, True], "s").agreement == 0.0
    with pytest.raises(ValueError, match="cannot be compared"):
        compare_pairs([True], [True, False], "s")
