"""LayerCFL: layer choice, the correct-clustering check as a gate, the 4-group hierarchy, a run."""

import json

import numpy as np
import pytest
from test_cfl import DIM, SHAPES, make_strategy, run_round

from clusterfed.simulation import simulate
from clusterfed.strategies.layercfl import LayerCFL

CONV = ["conv1.weight", "conv1.bias"]
FC = ["fc1.weight", "fc1.bias"]
CONV_SIZE = 8 * 9 + 8  # the first 80 coordinates of a full update vector


@pytest.mark.parametrize(("config", "names"), [
    ({"skew": "feature"}, CONV),
    ({"skew": "label"}, FC),
    ({"skew": "unknown"}, list(SHAPES)),  # default: every layer, as the paper (measured best)
    ({"skew": "unknown", "cluster_layers": "all"}, list(SHAPES)),  # explicit: every layer
    ({"skew": "unknown", "cluster_layers": "fc"}, FC),
    ({"skew": "label", "cluster_layers": "conv1"}, CONV),  # explicit names override the skew
])
def test_layers_follow_the_skew_or_explicit_names(config, names):
    strategy = make_strategy(LayerCFL, {"0": 0, "1": 0}, **config)
    assert strategy.decision_names() == names


def four_groups_in_conv(seed, m_per_group=3, noise=0.1, fc_noise=3.0):
    """12 clients, 4 groups; groups 0,1 share an axis (cos 0.3 between them), so do 2,3.
    The structure lives in the conv coordinates only; the fc coordinates are large noise."""
    rng = np.random.default_rng(seed)
    E = np.eye(CONV_SIZE)
    c, s = np.sqrt(0.3), np.sqrt(0.7)
    directions = [c * E[0] + s * E[1], c * E[0] + s * E[2], c * E[3] + s * E[4], c * E[3] + s * E[5]]
    labels = rng.permutation([g for g in range(4) for _ in range(m_per_group)])
    vectors = {}
    for i, g in enumerate(labels):
        conv = directions[g] + noise * rng.standard_normal(CONV_SIZE) / np.sqrt(CONV_SIZE)
        fc = fc_noise * rng.standard_normal(DIM - CONV_SIZE) / np.sqrt(DIM - CONV_SIZE)
        vectors[str(i)] = np.concatenate([conv, fc])
    return {str(i): int(g) for i, g in enumerate(labels)}, vectors


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_four_group_hierarchy_forms_and_the_check_stops_it_there(seed):
    groups, vectors = four_groups_in_conv(seed)
    strategy = make_strategy(LayerCFL, groups, skew="feature")
    for server_round in range(1, 5):
        run_round(strategy, server_round, vectors)
    first, *second = strategy.state.splits
    assert first["round"] == 1 and [s["round"] for s in second] == [2, 2]
    pairs = {frozenset(groups[k] for k in side) for side in first["members"]}
    assert pairs == {frozenset({0, 1}), frozenset({2, 3})}
    assert first["check"]["passed"]
    clusters = {}
    for key, cluster in strategy.assignment.items():
        clusters.setdefault(cluster, set()).add(groups[key])
    assert len(clusters) == 4 and all(len(g) == 1 for g in clusters.values())
    # rounds 3 and 4: each pure group of 3 is proposed for a split and refused — by CFL's
    # silhouette test (inherited, default split-min-silhouette) before the check is reached
    assert strategy.state.refused and all(r["reason"] == "silhouette" for r in strategy.state.refused)
    assert {r["round"] for r in strategy.state.refused} == {3, 4}
    assert strategy.state.final_clustering_round == 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_four_group_hierarchy_the_check_alone_stops_it(seed):
    """The same with the silhouette test off and the check enforced (default: recorded
    only): the correct-clustering check is what refuses."""
    groups, vectors = four_groups_in_conv(seed)
    strategy = make_strategy(LayerCFL, groups, skew="feature", split_min_silhouette=-1.0,
                             correct_clustering_check=True)
    for server_round in range(1, 5):
        run_round(strategy, server_round, vectors)
    assert len(strategy.state.splits) == 3 and all(s["check"]["passed"] for s in strategy.state.splits)
    assert strategy.state.refused and all(not r["check"]["passed"] for r in strategy.state.refused)
    assert {r["round"] for r in strategy.state.refused} == {3, 4}
    assert strategy.state.final_clustering_round == 2


def test_refused_split_leaves_the_cluster_whole():
    """One distribution plus noise: the criteria fire (forced), the bi-partition is proposed,
    the check (enforced) fails, nothing splits and the refusal is recorded."""
    rng = np.random.default_rng(0)
    direction = np.eye(DIM)[3]
    vectors = {str(i): direction + 0.3 * rng.standard_normal(DIM) / np.sqrt(DIM) for i in range(10)}
    strategy = make_strategy(LayerCFL, {k: 0 for k in vectors}, skew="unknown", split_min_silhouette=-1.0,
                             correct_clustering_check=True)
    model = {k: v.copy() for k, v in strategy.models[0].items()}
    extra = run_round(strategy, 1, vectors)
    assert strategy.state.splits == [] and set(strategy.assignment.values()) == {0}
    (refused,) = strategy.state.refused
    assert not refused["check"]["passed"] and refused["check"]["gamma_max"] >= refused["check"]["bound"]
    assert extra["refused_splits"][0]["passed"] is False
    assert all(np.array_equal(model[k], strategy.models[0][k]) for k in model)
    assert strategy.cluster_state()["refused_splits"] == strategy.state.refused


def test_check_switched_off_is_recorded_but_does_not_refuse():
    """The noise of test_refused_split_leaves_the_cluster_whole, check not enforced: it splits,
    and the failed check is in the split's record."""
    rng = np.random.default_rng(0)
    direction = np.eye(DIM)[3]
    vectors = {str(i): direction + 0.3 * rng.standard_normal(DIM) / np.sqrt(DIM) for i in range(10)}
    strategy = make_strategy(LayerCFL, {k: 0 for k in vectors}, skew="unknown", split_min_silhouette=-1.0,
                             correct_clustering_check=False)
    run_round(strategy, 1, vectors)
    (split,) = strategy.state.splits
    assert strategy.state.refused == [] and len(set(strategy.assignment.values())) == 2
    assert not split["check"]["passed"] and split["check"]["gamma_max"] >= split["check"]["bound"]


def test_the_layer_matters_fc_noise_hides_the_conv_groups():
    groups, vectors = four_groups_in_conv(0)
    wrong = make_strategy(LayerCFL, groups, skew="label", decision_arrays="every")  # the paper: the skew's layer
    for server_round in range(1, 4):
        run_round(wrong, server_round, vectors)
    assert wrong.state.splits == [] and wrong.state.refused  # every proposal on fc noise fails the check


def test_where_the_selected_layer_and_the_whole_update_are_blind_the_structured_array_is_compared():
    """decision-arrays = evidence (the default): the fc layer the skew picks and every array
    together show no structure, conv1.weight does in rounds 1 and 2, so it is compared from
    round 2 and the groups' pairs split off; the round line and the cluster state say so."""
    groups, vectors = four_groups_in_conv(0)
    strategy = make_strategy(LayerCFL, groups, skew="label")
    said = [run_round(strategy, server_round, vectors).get("decision", "") for server_round in range(1, 4)]
    assert strategy.decision_names() == CONV and strategy.state.chosen_arrays == tuple(CONV)
    assert "LayerCFL: compares conv1.weight (chosen by evidence in rounds 1 and 2" in said[1]
    assert "the fc layer no structure" in said[1] and "every array together no structure" in said[1]
    first = strategy.state.splits[0]
    assert {frozenset(groups[k] for k in side) for side in first["members"]} == {frozenset({0, 1}), frozenset({2, 3})}
    assert strategy.cluster_state()["array_choice"]["chosen_arrays"] == CONV


@pytest.mark.end_to_end
def test_layercfl_run_recovers_two_groups_and_records_the_check(small_config, tmp_path):
    config = small_config(strategy="layercfl", skew="label", partitioner="label-groups", label_groups="0-4;5-9",
                          num_clients=8, rounds=8, rel_eps2=2.0)
    summary = simulate(config, engine="inprocess", stream=None)
    clusters = json.load(open(f"{config.out_dir}/clusters.json"))
    assert summary["final_ari"] == 1.0 and summary["num_clusters"] == 2
    assert clusters["layers"] == {"rule": "fc", "names": FC}
    assert all(split["check"]["passed"] for split in clusters["splits"])
    assert clusters["final_clustering_round"] == clusters["splits"][-1]["round"]


def test_layers_the_user_named_are_compared_even_where_they_are_blind():
    """cluster-layers given (not auto): the user's layers are compared; decision-arrays = evidence
    chooses nothing, and the cluster state says which layers."""
    groups, vectors = four_groups_in_conv(0)
    strategy = make_strategy(LayerCFL, groups, cluster_layers="fc1")
    for server_round in range(1, 4):
        run_round(strategy, server_round, vectors)
    assert strategy.state.chosen_arrays == () and strategy.decision_names() == FC
    assert strategy.cluster_state()["layers"]["names"] == FC
