"""HiCFL: split timing by model stability, reference bi-partition, stop rule, weight selection."""

import json

import numpy as np
import pytest
from test_cfl import DIM, arrays_of, make_strategy, run_round

from clusterfed.clustering.stability import StabilityTracker, select_unstable_weights
from clusterfed.plots.splits import plot_split_figures
from clusterfed.simulation import simulate
from clusterfed.clustering.vectors import flatten
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.clustering.vectors import side_of

# the paper's rule: absolute ε, every member below it, sign of the cosine with the reference,
# heterogeneity stop rule (no structure test), no merging
# the paper's rules, its stability timing included (split-timing = criteria; the default splits on evidence)
PAPER = {"split_timing": "criteria", "hicfl_timing": "all", "hicfl_split": "reference", "hicfl_min_silhouette": -1,
         "merge": False}
UNIT = {"split_criteria": "relative", "window": 3, "stability_eps": 0.5, "xi": 1e-9, "min_split_round": 1, **PAPER}


def two_opposite_groups(seed, oscillate_until):
    """6 clients, groups 0/1 pull in opposite directions. Until ``oscillate_until`` every
    client's update flips sign each round (T ≈ −1, T_{t−2~t} ≈ +1: S ≈ 2, unstable); after it
    the direction holds (S ≈ 0)."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal(DIM)
    d /= np.linalg.norm(d)
    groups = {str(i): i % 2 for i in range(6)}

    def updates(server_round):
        sign = (-1) ** server_round if server_round <= oscillate_until else 1
        return {k: sign * ((1 if g == 0 else -1) * d + 0.01 * rng.standard_normal(DIM) / np.sqrt(DIM))
                for k, g in groups.items()}

    return groups, updates


def test_no_split_while_stability_is_above_epsilon_then_split_when_it_falls_below():
    groups, updates = two_opposite_groups(0, oscillate_until=6)
    strategy = make_strategy(HiCFL, groups, **UNIT)
    history = []
    for server_round in range(1, 17):
        extra = run_round(strategy, server_round, updates(server_round))
        history.append((server_round, extra["stability"], [s["round"] for s in strategy.state.splits]))
    (split,) = strategy.state.splits
    # W = 3, stability from the 2nd update on (ξ selection), first score at round 4;
    # windowed S: rounds 6..10 = 2, 5/3, 1, 1/3, 0 → first below ε = 0.5 at round 9
    assert split["round"] == 9
    for server_round, stability, splits_so_far in history:
        ready = any(all(v[layer] is not None and v[layer] < 0.5 for v in stability.values())
                    for layer in strategy.state.layers)
        if server_round < 9:
            assert not ready and splits_so_far == []
        if server_round == 9:
            assert ready
    sides = [{groups[k] for k in side} for side in split["members"]]
    assert sorted(map(sorted, sides)) == [[0], [1]]
    assert split["reference"] in split["members"][0]
    assert split["stability"][split["reference"]] == min(split["stability"].values())
    # children restart their windows: ready again at round 14, but their members agree
    later = [n for n in strategy.state.no_split if n["round"] >= 14]
    assert later and all(n["reason"].startswith("updates agree") for n in later)
    assert strategy.state.final_clustering_round == 9


def test_every_member_on_the_reference_side_means_no_split():
    """The paper's raw sign rule (centring off): one shared direction, nobody opposes it."""
    rng = np.random.default_rng(1)
    d = rng.standard_normal(DIM)
    groups = {str(i): 0 for i in range(5)}
    strategy = make_strategy(HiCFL, groups, **{**UNIT, "split_criteria": "absolute", "eps1": 1e6, "eps2": 1e-6,
                                               "centre_updates": False})
    for server_round in range(1, 10):
        run_round(strategy, server_round, {k: d + 0.1 * rng.standard_normal(DIM) / np.sqrt(DIM) for k in groups})
    assert strategy.state.splits == []
    assert any(n["code"] == "one_side" for n in strategy.state.no_split)


def shared_direction_groups(seed):
    """8 clients: a large common direction c shared by all, plus ±g by group (3 vs 5), the
    groups' parts not summing to zero. Raw cosines with anyone are all ≈ +1."""
    rng = np.random.default_rng(seed)
    c, g = np.zeros(DIM), np.zeros(DIM)
    c[0], g[1] = 10.0, 1.0
    groups = {str(i): int(i < 3) for i in range(8)}

    def updates(server_round):
        return {k: c + (1.5 if grp else -0.8) * g + 0.05 * rng.standard_normal(DIM) for k, grp in groups.items()}

    return groups, updates


@pytest.mark.parametrize("centre", [True, False])
def test_centred_reference_split_separates_groups_under_a_shared_direction(centre):
    groups, updates = shared_direction_groups(4)
    strategy = make_strategy(HiCFL, groups, **{**UNIT, "split_criteria": "absolute", "eps1": 1e6, "eps2": 1e-6,
                                               "centre_updates": centre})
    for server_round in range(1, 10):
        run_round(strategy, server_round, updates(server_round))
    if not centre:  # the paper's raw sign: everyone on the reference's side, no split
        assert strategy.state.splits == []
        return
    split = strategy.state.splits[0]
    assert split["centred"] is True
    assert sorted(sorted({groups[k] for k in side}) for side in split["members"]) == [[0], [1]]
    assert sorted(len(side) for side in split["members"]) == [3, 5]
    # a newcomer replays the centred rule: its update minus the split round's mean
    route = strategy.state.routes[split["parent"]]
    ref_group = groups[split["reference"]]
    for grp in (0, 1):
        vector = np.zeros(DIM)
        vector[0], vector[1] = 10.0, (1.5 if grp else -0.8)
        on_layer = flatten(arrays_of(vector), route["names"])
        assert (side_of(on_layer, route) == 0) == (grp == ref_group)


def test_weight_selection_floor():
    new, old = np.zeros(100), np.zeros(100)
    new[7] = 1.0
    assert select_unstable_weights(new, old, xi=0.5).tolist() == [7]  # the paper's rule
    assert select_unstable_weights(new, old, xi=0.5, min_kept=5).size == 100  # too few: whole layer
    tracker = StabilityTracker(window=2, xi=0.5, min_kept_fraction=0.05)
    tracker.add("a", "l", old)
    tracker.add("a", "l", new)
    assert tracker.kept_fraction("a", "l") == 1.0
    with pytest.raises(ValueError):
        StabilityTracker(min_kept_fraction=1.5)


def test_kept_fraction_and_stability_reported():
    groups, updates = two_opposite_groups(3, oscillate_until=100)
    strategy = make_strategy(HiCFL, groups, **UNIT)
    extra = {}
    for server_round in range(1, 6):
        extra = run_round(strategy, server_round, updates(server_round))
    assert extra["weights_kept_total"] == 1.0 and set(extra["weights_kept"]) == {"conv1", "fc1"}
    assert set(extra["stability"]) == set(groups) and extra["stability_eps"] == 0.5


# ----------------------------------------------------------------------------- whole runs


@pytest.mark.end_to_end
def test_hicfl_run_recovers_two_groups(small_config, tmp_path):
    """ε = 0.05 (default 0.5 · lr = 0.025): with 12 clients the windowed stability of every
    client drops below 0.05 on one layer by round 8 here; below 0.025 only later. rel-eps2 = 2
    (default 3): two groups of 6 show max/mean update norms of ≈ 2.9 at that round."""
    config = small_config(strategy="hicfl", partitioner="label-groups", label_groups="0-4;5-9", num_clients=12,
                          rounds=10, stability_eps=0.05, rel_eps2=2.0, **PAPER)
    summary = simulate(config, engine="inprocess", stream=None)
    clusters = json.load(open(f"{config.out_dir}/clusters.json"))
    assert summary["final_ari"] == 1.0 and summary["num_clusters"] == 2
    split = clusters["splits"][0]
    assert {"layer", "reference", "stability", "criterion", "gap", "true_group_gap", "similarity"} <= set(split)
    rounds = [json.loads(line) for line in open(f"{config.out_dir}/rounds.jsonl")]
    before = rounds[split["round"] - 2]["stability"]  # the round before the split: not all below ε somewhere
    epsilon = rounds[0]["stability_eps"]
    assert not any(all(v[layer] is not None and v[layer] < epsilon for v in before.values())
                   for layer in clusters["layers"])
    written = {p.name for p in plot_split_figures(config.out_dir)}
    assert {"split_timeline.png", "stability.png", "similarity_splits.png", "update_norms.png"} == written


@pytest.mark.end_to_end
def test_hicfl_never_splits_with_a_tiny_epsilon(small_config, tmp_path):
    config = small_config(strategy="hicfl", partitioner="label-groups", label_groups="0-4;5-9", num_clients=8,
                          rounds=10, stability_eps=1e-9, split_timing="criteria")  # the stability timing
    simulate(config, engine="inprocess", stream=None)
    clusters = json.load(open(f"{config.out_dir}/clusters.json"))
    assert clusters["splits"] == [] and clusters["final_clustering_round"] is None
    last = [json.loads(line) for line in open(f"{config.out_dir}/rounds.jsonl")][-1]
    assert all(v is not None and v > 1e-9 for s in last["stability"].values() for v in s.values())


@pytest.mark.parametrize("value", [None, 0.0, float("nan")])
def test_the_stability_figure_draws_when_no_window_is_full_or_every_value_is_zero(tmp_path, value):
    """Splits on evidence can come before any stability window fills: every value is None
    (or zero, or a non-positive ε); the figure is drawn, never a log axis with nothing positive."""
    from clusterfed.plots.splits import plot_stability

    rounds = [{"round": r, "stability_eps": value if value is not None else None,
               "stability": {"0": {"conv1": value, "fc1": value}, "1": {"conv1": value, "fc1": value}}}
              for r in range(1, 5)]
    path = tmp_path / "stability.png"
    plot_stability(rounds, [{"round": 3}], path, "evidence before the windows")
    assert path.stat().st_size > 0
    rounds[-1]["stability_eps"] = -1.0  # a non-positive ε beside positive values: left off the log axis
    rounds[-1]["stability"]["0"]["conv1"] = 0.02
    plot_stability(rounds, [], path, "one value")
    assert path.stat().st_size > 0


def lstm_arrays(vector_of=None):
    """An LSTM of 2 layers and a linear head (torch's names and shapes), all zero or from ``vector_of(name, shape)``."""
    import torch

    model = torch.nn.ModuleDict({"rnn": torch.nn.LSTM(6, 4, num_layers=2), "head": torch.nn.Linear(4, 3)})
    return {n: (np.zeros(p.shape, np.float32) if vector_of is None else vector_of(n, p.shape)).astype(np.float32)
            for n, p in model.state_dict().items()}


def test_a_recurrent_layers_input_and_hidden_weights_are_watched_as_layers_of_their_own():
    """torch's LSTM holds every layer's input and hidden weights in one module: each weight
    with its own bias is a layer (the groups of a label swap can live in the input weights
    alone), a linear layer stays weight and bias together."""
    from types import SimpleNamespace

    from clusterfed.strategies import hicfl_stability as windows

    state = SimpleNamespace(theta0=lstm_arrays())
    windows.watch(state, list(state.theta0))
    assert state.layer_keys == {
        "rnn.ih_l0": ["rnn.weight_ih_l0", "rnn.bias_ih_l0"], "rnn.hh_l0": ["rnn.weight_hh_l0", "rnn.bias_hh_l0"],
        "rnn.ih_l1": ["rnn.weight_ih_l1", "rnn.bias_ih_l1"], "rnn.hh_l1": ["rnn.weight_hh_l1", "rnn.bias_hh_l1"],
        "head": ["head.weight", "head.bias"]}
    assert state.layer_sizes["rnn.ih_l0"] == 16 * 6 + 16 and state.layers[0] == "rnn.ih_l0"


def two_groups_in_conv_only(seed, per_group=6):
    """12 clients in 2 groups that differ only in conv1 (weight and bias); every other array is
    large noise of each client's own, so every array together shows no structure."""
    from test_cfl import SHAPES

    rng = np.random.default_rng(seed)
    conv = int(np.prod(SHAPES["conv1.weight"])) + int(np.prod(SHAPES["conv1.bias"]))
    labels = rng.permutation([g for g in range(2) for _ in range(per_group)])
    directions = rng.standard_normal((2, conv))

    def updates(_round):
        out = {}
        for i, g in enumerate(labels):
            v = 4.0 * rng.standard_normal(DIM) / np.sqrt(DIM) * np.sqrt(DIM - conv)
            v[:conv] = directions[g] / np.sqrt(conv) + 0.2 * rng.standard_normal(conv) / np.sqrt(conv)
            out[str(i)] = v
        return out

    return {str(i): int(g) for i, g in enumerate(labels)}, updates


def test_where_every_array_together_is_blind_the_split_is_reproduced_and_proposed_on_the_structured_array():
    """decision-arrays = evidence (the default): conv1.weight separates the groups in rounds 1 and 2
    while every array together does not; it is chosen in round 2, the partitions of every array
    are forgotten, and the split, on conv1, reproduces in rounds 2 and 3. On every array
    together successive rounds never agree."""
    groups, updates = two_groups_in_conv_only(0)
    rounds = [updates(r) for r in range(1, 6)]
    said = {}
    for arrays in ("evidence", "every"):
        strategy = make_strategy(HiCFL, groups, split_timing="evidence", min_split_round=1, window=2,
                                 decision_arrays=arrays)
        said[arrays] = [run_round(strategy, r, rounds[r - 1]).get("decision", "") for r in range(1, 6)]
        if arrays == "every":
            assert strategy.state.splits == [] and strategy.state.chosen_arrays == ()
            continue
        assert strategy.state.chosen_arrays == ("conv1.weight", "conv1.bias")
        assert ("HiCFL: cuts the partitions a split must reproduce, and proposes splits, on conv1.weight (chosen by "
                "evidence in rounds 1 and 2") in said[arrays][1]
        (first,) = strategy.state.splits
        assert first["layer"] == "conv1" and first["round"] == 3
        assert {frozenset(groups[k] for k in side) for side in first["members"]} == {frozenset({0}), frozenset({1})}
        assert strategy.cluster_state()["array_choice"]["chosen_arrays"] == ["conv1.weight", "conv1.bias"]
