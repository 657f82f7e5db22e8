"""HiCFL model stability, weight selection, split timing and the reference split."""

import numpy as np
import pytest

from clusterfed.clustering.stability import (
    StabilityTracker,
    centred_reference_split,
    centred_updates,
    cluster_ready_to_split,
    fraction_kept,
    reference_split,
    select_unstable_weights,
    stability_score,
)

E1, E2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])


# --------------------------------------------------------------------------- S_t by hand


def test_identical_updates_are_perfectly_stable():
    v = np.array([0.3, -1.2, 4.0])
    assert stability_score(v, v, v) == 0.0
    assert stability_score(v, 2 * v, 0.5 * v) == pytest.approx(0.0)  # scale does not matter


def test_stability_hand_computed():
    # Δ_{t−2}=(3,4), Δ_{t−1}=(4,3), Δ_t=(0,5); all norms 5
    # T_{t−1} = 24/25 = 0.96, T_t = 15/25 = 0.6, T_{t−2~t} = 20/25 = 0.8
    # S = |(0.6 + 0.96)/2 − 0.8| = |0.78 − 0.8| = 0.02
    assert stability_score([3, 4], [4, 3], [0, 5]) == pytest.approx(0.02)
    # e1 → (e1+e2)/√2 → e2: T_t = T_{t−1} = 1/√2, T_{t−2~t} = 0
    assert stability_score(E1, E1 + E2, E2) == pytest.approx(1 / np.sqrt(2))
    # e1 → e2 → e1 (oscillation): T = 0, 0 and T_{t−2~t} = 1 → S = 1
    assert stability_score(E1, E2, E1) == pytest.approx(1.0)
    # e1 → e2 → −e1: S = |0 − (−1)| = 1
    assert stability_score(E1, E2, -E1) == pytest.approx(1.0)


def test_zero_update_gives_finite_score():
    z = np.zeros(2)
    # cos with a zero vector counts as 0: T_t = 0, T_{t−1} = 0, T_{t−2~t} = 1 → 1
    assert stability_score(E1, z, E1) == pytest.approx(1.0)
    assert stability_score(z, z, z) == 0.0
    with pytest.raises(ValueError):
        stability_score(E1, E1, np.ones(3))


# --------------------------------------------------------------------------- weight selection


def test_select_unstable_weights():
    new = np.array([0.10, 0.50, -0.20, 0.00, 0.31])
    old = np.array([0.10, 0.20, 0.20, 0.04, 0.30])
    idx = select_unstable_weights(new, old, xi=0.05)
    assert idx.tolist() == [1, 2]  # |Δ| = 0, .3, .4, .04, .01
    assert fraction_kept(idx, new.size) == pytest.approx(0.4)
    # nothing moved by more than ξ: keep everything, never an empty selection
    idx = select_unstable_weights(new, new + 0.01, xi=0.05)
    assert idx.tolist() == [0, 1, 2, 3, 4]
    assert fraction_kept(None, 5) == 1.0


# --------------------------------------------------------------------------- tracker


def test_tracker_window_fills_then_answers():
    tr = StabilityTracker(window=3)
    v = np.array([1.0, 2.0, 3.0])
    returned = [tr.add("c0", "fc", v) for _ in range(5)]
    assert returned[:2] == [None, None]  # S needs three updates
    assert returned[2:] == [0.0, 0.0, 0.0]
    assert tr.windowed("c0", "fc") == 0.0  # 3 scores = W
    assert tr.windowed("c0", "conv") is None  # never seen
    assert tr.windowed("nobody", "fc") is None


def test_tracker_windowed_mean_over_last_w_scores():
    tr = StabilityTracker(window=2)
    seq = [E1, E2, E1, E2 + E1, E2]
    # scores: (E1,E2,E1) -> 1; (E2,E1,E1+E2): T_t = 1/√2, T_{t−1} = 0, T_span = 1/√2
    #   -> |1/(2√2) − 1/√2| = 1/(2√2); (E1, E1+E2, E2) -> 1/√2
    scores = [s for s in (tr.add("k", 0, u) for u in seq) if s is not None]
    np.testing.assert_allclose(scores, [1.0, 1 / (2 * np.sqrt(2)), 1 / np.sqrt(2)])
    assert tr.scores("k", 0) == pytest.approx(scores[1:])
    assert tr.windowed("k", 0) == pytest.approx((1 / (2 * np.sqrt(2)) + 1 / np.sqrt(2)) / 2)


def test_tracker_reset_restarts_members_only():
    tr = StabilityTracker(window=1)
    for _ in range(3):
        tr.add("a", "fc", E1)
        tr.add("b", "fc", E1)
    assert tr.windowed("a", "fc") == 0.0 and tr.windowed("b", "fc") == 0.0
    tr.reset(["a"])
    assert tr.windowed("a", "fc") is None
    assert tr.windowed("b", "fc") == 0.0
    assert tr.add("a", "fc", E1) is None  # history restarted too
    tr.add("a", "fc", E1)
    assert tr.add("a", "fc", E1) == 0.0


def test_tracker_manual_selection_uses_only_selected_weights():
    tr = StabilityTracker(window=1)
    tr.set_selection("c", "fc", np.array([0, 1]))
    rng = np.random.default_rng(1)
    for _ in range(3):
        # selected coordinates constant, the others random: selected S = 0
        s = tr.add("c", "fc", np.concatenate([[1.0, 2.0], rng.standard_normal(3)]))
    assert s == pytest.approx(0.0)
    assert tr.kept_fraction("c", "fc") == pytest.approx(2 / 5)


def test_tracker_automatic_selection_with_xi():
    tr = StabilityTracker(window=1, xi=0.05)
    first = np.array([0.0, 0.0, 1.0, 1.0])
    assert tr.add("c", "fc", first) is None
    assert tr.selection("c", "fc") is None and tr.kept_fraction("c", "fc") is None
    second = np.array([0.3, 0.0, 1.0, 1.2])  # weights 0 and 3 moved by more than ξ
    tr.add("c", "fc", second)
    assert tr.selection("c", "fc").tolist() == [0, 3]
    assert tr.kept_fraction("c", "fc") == pytest.approx(0.5)
    assert tr.add("c", "fc", second) is None  # history holds 2 selected updates
    assert tr.add("c", "fc", second) == pytest.approx(0.0)
    # after a split the selection is redone from the next update vs the last one
    tr.reset(["c"])
    assert tr.selection("c", "fc") is None
    third = np.array([0.3, 0.5, 1.0, 1.2])
    tr.add("c", "fc", third)
    assert tr.selection("c", "fc").tolist() == [1]
    np.testing.assert_array_equal(tr.last_update("c", "fc"), third)


def test_tracker_rejects_size_change():
    tr = StabilityTracker(window=2)
    tr.add("c", "fc", np.ones(3))
    with pytest.raises(ValueError):
        tr.add("c", "fc", np.ones(4))


# --------------------------------------------------------------------------- split timing


def _feed(tr, key, layer, vectors):
    for v in vectors:
        tr.add(key, layer, v)


def test_cluster_ready_to_split_only_when_all_members_below_epsilon():
    tr = StabilityTracker(window=2)
    steady = [E1] * 4  # S = 0, 0
    wobbly = [E1, E2, E1, E2]  # S = 1, 1
    for key in ("a", "b", "c"):
        _feed(tr, key, "fc", steady)
        _feed(tr, key, "conv", wobbly)
    assert cluster_ready_to_split(tr, ["a", "b", "c"], ["conv", "fc"], epsilon=0.5) == "fc"
    assert cluster_ready_to_split(tr, ["a", "b", "c"], ["conv"], epsilon=0.5) is None
    # one member above ε on fc: not ready
    _feed(tr, "d", "fc", wobbly)
    assert cluster_ready_to_split(tr, ["a", "b", "d"], ["conv", "fc"], epsilon=0.5) is None
    # one member whose window is not full yet: not ready
    _feed(tr, "e", "fc", steady[:3])  # one score, W = 2
    assert tr.windowed("e", "fc") is None
    assert cluster_ready_to_split(tr, ["a", "e"], ["fc"], epsilon=0.5) is None
    # strict inequality, and the first qualifying layer in the given order wins
    assert cluster_ready_to_split(tr, ["a"], ["fc"], epsilon=0.0) is None
    assert cluster_ready_to_split(tr, ["a"], ["conv", "fc"], epsilon=1.5) == "conv"
    assert cluster_ready_to_split(tr, [], ["fc"], epsilon=1.0) is None


# --------------------------------------------------------------------------- reference split


def test_reference_split_on_opposite_signs():
    u = np.array([1.0, 0.2, 0.0])
    updates = {
        "c3": u + [0, 0, 0.1],
        "c1": -u,
        "c7": 2 * u,
        "c0": -u + [0, 0.5, 0],
        "c5": np.array([0.0, 0.0, 1.0]),  # cos = 0 with the reference: not > 0
    }
    stability = {"c3": 0.3, "c1": 0.2, "c7": 0.05, "c0": 0.4, "c5": 0.1}
    ref_side, other = reference_split(updates, stability)
    assert ref_side == ["c3", "c7"]  # c7 is the reference (least S)
    assert other == ["c1", "c0", "c5"]

    # reference on the negative side: the sides swap roles
    stability["c1"] = 0.0
    ref_side, other = reference_split(updates, stability)
    assert ref_side == ["c1", "c0"] and other == ["c3", "c7", "c5"]


def test_reference_split_never_empty_side():
    updates = {"a": E1, "b": E1 + 0.1 * E2, "c": 3 * E1}
    assert reference_split(updates, {"a": 0.1, "b": 0.2, "c": 0.3}) is None
    assert reference_split({"a": E1}, {"a": 0.0}) is None
    with pytest.raises(ValueError):
        reference_split(updates, {"a": 0.1})


# --------------------------------------------------------------------------- centred reference split


def shared_component_updates(seed=0, dim=40):
    """Two groups (4 and 6 clients) with group parts +1.5·g and −1·g, plus a shared
    component 10·c (c ⟂ g) and small noise: what early FL rounds look like."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal(dim)
    c *= 10 / np.linalg.norm(c)
    g = rng.standard_normal(dim)
    g -= (g @ c) / (c @ c) * c
    g /= np.linalg.norm(g)
    groups = {f"k{i}": int(i < 4) for i in range(10)}
    updates = {k: c + (1.5 if grp else -1.0) * g + 0.05 * rng.standard_normal(dim) for k, grp in groups.items()}
    return groups, updates


def test_raw_sign_split_fails_and_centred_split_recovers_groups_under_a_shared_component():
    groups, updates = shared_component_updates()
    stability = {k: 0.1 + 0.01 * i for i, k in enumerate(updates)}  # reference k0 (group 1)
    assert reference_split(updates, stability) is None  # every raw cosine > 0: nothing to split
    side_a, side_b = centred_reference_split(updates, stability)
    assert side_a == ["k0", "k1", "k2", "k3"] and side_b == [f"k{i}" for i in range(4, 10)]


def test_centred_updates_weighted_mean():
    updates = {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0])}
    c = centred_updates(updates, {"a": 3, "b": 1})  # mean = (0.75, 0.25)
    np.testing.assert_allclose(c["a"], [0.25, -0.25])
    np.testing.assert_allclose(c["b"], [-0.75, 0.75])
    c = centred_updates(updates)  # equal weights
    np.testing.assert_allclose(c["a"], [0.5, -0.5])
    np.testing.assert_allclose(centred_updates(updates, {"a": 0, "b": 0})["a"], [0.5, -0.5])
    assert centred_updates({}) == {}
    # weighted mean of the centred updates is zero
    rng = np.random.default_rng(0)
    ups = {i: rng.standard_normal(5) for i in range(4)}
    w = {0: 1, 1: 2, 2: 3, 3: 4}
    c = centred_updates(ups, w)
    np.testing.assert_allclose(sum(w[i] * c[i] for i in ups), 0.0, atol=1e-12)


def test_centred_split_on_identical_updates_leaves_no_empty_side():
    v = np.array([1.0, 2.0, 3.0])
    updates = {k: v.copy() for k in "abc"}
    # all centred updates are zero: cos = 0, nobody but the reference joins its side
    sides = centred_reference_split(updates, {"a": 0.0, "b": 1.0, "c": 1.0})
    assert sides == (["a"], ["b", "c"])
