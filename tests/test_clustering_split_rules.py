import numpy as np
import pytest

from clusterfed.clustering.split_rules import (
    best_separated_layers,
    choose_split,
    layer_scale,
    merge_pairs,
    one_cluster_reason,
    ready_layers,
    relative_stability,
)


def test_layer_scale_median_and_unfilled():
    assert layer_scale({"a": 0.01, "b": 0.03, "c": 0.02}) == pytest.approx(0.02)
    assert layer_scale({"a": 0.01, "b": None}) is None
    assert layer_scale({"a": 0.0, "b": 0.0, "c": 0.4}) == pytest.approx(0.4)
    assert layer_scale({"a": 0.0}) is None


def test_relative_stability_removes_layer_scale():
    conv = {"a": 0.03, "b": 0.03}
    fc = {"a": 0.01, "b": 0.01}
    # absolute ε = 0.025 would pick fc only; relative to each layer's own scale both equal 1
    assert relative_stability(conv, layer_scale(conv)) == {"a": 1.0, "b": 1.0}
    assert relative_stability(fc, layer_scale(fc)) == {"a": 1.0, "b": 1.0}
    assert relative_stability({"a": None}, 1.0) is None
    assert relative_stability(conv, None) is None


def test_ready_layers_every_member_below():
    rel = {"conv": {"a": 0.5, "b": 1.2}, "fc": {"a": 0.9, "b": 0.8}, "x": None}
    assert ready_layers(rel, 1.0) == ["fc"]
    assert ready_layers(rel, 1.5) == ["conv", "fc"]


def two_groups(noise, seed=0, m=10, d=50):
    rng = np.random.default_rng(seed)
    g = np.zeros((m, d))
    g[: m // 2, 0] = 1.0
    g[m // 2:, 1] = 1.0
    return g + noise * rng.normal(size=(m, d))


def test_choose_split_prefers_separated_layer_and_refuses_noise():
    sep = two_groups(0.05)
    rng = np.random.default_rng(1)
    noise = rng.normal(size=(10, 50))
    a, b = np.arange(5), np.arange(5, 10)
    choice = choose_split({"noise": (noise, a, b), "sep": (sep, a, b)}, 0.3)
    assert choice.layer == "sep" and choice.silhouette > 0.8
    assert choice.silhouettes["noise"] < 0.1
    assert choose_split({"noise": (noise, a, b)}, 0.3).layer is None
    assert choose_split({}, 0.3).layer is None


def test_best_separated_layers():
    rng = np.random.default_rng(2)
    name, scores = best_separated_layers({"fc": rng.normal(size=(10, 40)), "conv": two_groups(0.1)}, 6)
    assert name == "conv" and scores["conv"] > scores["fc"]
    with pytest.raises(ValueError):
        best_separated_layers({})


def test_merge_pairs_merges_indistinguishable_keeps_distinct():
    rng = np.random.default_rng(3)
    common = np.zeros(30)
    common[0] = 1.0
    other = np.zeros(30)
    other[1] = 1.0
    c1 = common + 0.1 * rng.normal(size=(4, 30))  # two halves of one distribution
    c2 = common + 0.1 * rng.normal(size=(4, 30))
    c3 = other + 0.1 * rng.normal(size=(4, 30))  # a different distribution
    pairs = merge_pairs({1: c1, 2: c2, 3: c3}, min_cosine=0.5, max_silhouette=0.1)
    assert [(p.a, p.b) for p in pairs] == [(1, 2)]
    assert pairs[0].cosine > 0.8 and pairs[0].silhouette < 0.1


def test_merge_pairs_each_cluster_once_and_singletons():
    v = np.ones((1, 5))
    pairs = merge_pairs({"a": v, "b": v, "c": v}, min_cosine=0.5)
    assert len(pairs) == 1 and np.isnan(pairs[0].silhouette)


def test_one_cluster_reason():
    from clusterfed.strategies.cfl import CFL
    from clusterfed.strategies.hicfl import HiCFL
    from clusterfed.strategies.layercfl import LayerCFL

    assert "stability" in one_cluster_reason(HiCFL.one_cluster_reasons, [], timing="stability")
    assert "criteria never met" in one_cluster_reason(CFL.one_cluster_reasons, [])
    text = one_cluster_reason(LayerCFL.one_cluster_reasons, ["check", "check", "silhouette"])
    assert "correct-clustering check" in text and "check ×2" in text
    assert "min-split-size" in one_cluster_reason(CFL.one_cluster_reasons, ["silhouette"], could_split=False)
