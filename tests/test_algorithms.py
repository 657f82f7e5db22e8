"""Every strategy as a transport-free algorithm: fed replies by hand, no Grid, no Flower."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from harness import drive_round, hand, make, theta0, trained

from clusterfed.strategies import REGISTRY, clustered_classes, strategy_class

ALGORITHMS = list(clustered_classes())
TWO_GROUPS = {str(i): i % 2 for i in range(6)}


def by_group(groups, noise=0.01, seed=0):
    """A client's trained arrays: +1 or -1 per its group, plus a little noise."""
    rng = np.random.default_rng(seed)

    def respond(ask):
        out = trained(ask, 1.0 if groups[ask.key] == 0 else -1.0)
        return {n: v + rng.normal(0, noise, v.shape).astype(np.float32) for n, v in out.items()}

    return respond


def test_strategy_modules_do_not_import_torch():
    """The server side works on whatever arrays the user's ArrayRecord holds."""
    modules = [REGISTRY[name].split(":")[0] for name in ALGORITHMS] + ["clusterfed.runner.driver", "clusterfed"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\nprint(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_fedavg_averages_the_replies_weighted_by_examples():
    algorithm = make(strategy_class("fedavg"), {"0": 0, "1": 0, "2": 0})
    shifts, examples = {"0": 1.0, "1": 2.0, "2": 6.0}, {"0": 10, "1": 10, "2": 20}
    (asks,) = drive_round(algorithm, 1, lambda ask: trained(ask, shifts[ask.key]), examples)
    assert [a.key for a in asks] == ["0", "1", "2"] and all(a.config["upload"] == "full" for a in asks)
    expected = (1.0 * 10 + 2.0 * 10 + 6.0 * 20) / 40
    for value in algorithm.models[0].values():
        np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_a_cluster_whose_members_all_failed_keeps_its_model():
    algorithm = make(strategy_class("oracle"), TWO_GROUPS)
    drive_round(algorithm, 1, lambda ask: trained(ask, 1.0) if TWO_GROUPS[ask.key] == 0 else None)
    clusters = {TWO_GROUPS[k]: c for k, c in algorithm.assignment.items()}
    assert all(np.all(v == 1.0) for v in algorithm.models[clusters[0]].values())
    assert all(np.all(v == 0.0) for v in algorithm.models[clusters[1]].values())


def test_fedprox_asks_for_the_proximal_term():
    algorithm = make(strategy_class("fedprox"), {"0": 0}, proximal_mu=0.3)
    (asks,) = drive_round(algorithm, 1, lambda ask: trained(ask, 0.0))
    assert asks[0].config["proximal-mu"] == 0.3


def test_local_keeps_one_model_per_client():
    algorithm = make(strategy_class("local"), {"0": 0, "1": 0})
    drive_round(algorithm, 1, lambda ask: trained(ask, 1.0 if ask.key == "0" else 5.0))
    models = {k: algorithm.models[c] for k, c in algorithm.assignment.items()}
    assert np.all(models["0"]["fc2.bias"] == 1.0) and np.all(models["1"]["fc2.bias"] == 5.0)


def test_oracle_clusters_are_the_true_groups():
    algorithm = make(strategy_class("oracle"), TWO_GROUPS)
    drive_round(algorithm, 1, lambda ask: trained(ask, 0.0))
    assert len(set(algorithm.assignment.values())) == 2
    assert all((algorithm.assignment[a] == algorithm.assignment[b]) == (TWO_GROUPS[a] == TWO_GROUPS[b])
               for a in TWO_GROUPS for b in TWO_GROUPS)


def test_fedclust_asks_for_the_final_layer_then_serves_each_cluster_its_model():
    algorithm = make(strategy_class("fedclust"), TWO_GROUPS, cluster_epochs=4, **{"fedclust.cluster-layers": "final"})
    cluster_asks, train_asks = drive_round(algorithm, 1, by_group(TWO_GROUPS))
    assert {a.config["phase"] for a in cluster_asks} == {"cluster"}
    assert all(a.upload == ["fc2.weight", "fc2.bias"] and a.config["local-epochs"] == 4 for a in cluster_asks)
    assert all(np.array_equal(a.model["conv1.weight"], theta0()["conv1.weight"]) for a in cluster_asks)
    same = [(algorithm.assignment[a] == algorithm.assignment[b]) == (TWO_GROUPS[a] == TWO_GROUPS[b])
            for a in TWO_GROUPS for b in TWO_GROUPS]
    assert all(same) and len(algorithm.models) == 2
    assert {a.config["cluster-id"] for a in train_asks} == set(algorithm.models)
    # a newcomer of group 1 trains θ0, uploads the final layer and joins group 1's cluster
    hand(algorithm).clients["9"] = type(hand(algorithm).clients["0"])("9", 50, 1)
    hand(algorithm).active = [*TWO_GROUPS, "9"]
    placement, _ = drive_round(algorithm, 2, by_group({**TWO_GROUPS, "9": 1}, seed=1))
    assert [a.key for a in placement] == ["9"] and placement[0].upload == ["fc2.weight", "fc2.bias"]
    assert algorithm.assignment["9"] == algorithm.assignment["1"]


def test_adacfl_warms_up_then_clusters_on_the_smallest_fc_layer():
    stats = {k: {"num-classes": 2, "label-entropy": 1.0} for k in TWO_GROUPS}
    algorithm = make(strategy_class("adacfl"), TWO_GROUPS, stats=stats, warmup_rounds=1,
                     **{"adacfl.cluster-layers": "smallest-fc"})
    (warmup,) = drive_round(algorithm, 1, lambda ask: trained(ask, 0.5))
    assert all(a.upload is None for a in warmup) and len(algorithm.models) == 1
    cluster_asks, _ = drive_round(algorithm, 2, by_group(TWO_GROUPS))
    assert all(a.upload == ["fc1.weight", "fc1.bias"] for a in cluster_asks)
    # the clustering step starts from the warm-up model, not θ0
    assert all(np.all(a.model["fc1.bias"] == 0.5) for a in cluster_asks)
    assert len(set(algorithm.assignment.values())) == 2


@pytest.mark.parametrize("name", ["cfl", "layercfl", "hicfl"])
def test_bipartitioning_asks_for_updates(name):
    algorithm = make(strategy_class(name), TWO_GROUPS)
    (asks,) = drive_round(algorithm, 1, lambda ask: trained(ask, 0.1))
    assert all(a.config["return"] == "update" for a in asks)
    assert all(np.allclose(v, 0.1) for v in algorithm.models[0].values())  # θ0 + the mean update


def test_cfl_newcomer_descends_the_tree_uploading_the_decision_layers():
    always = {"split_criteria": "absolute", "eps1": 1e6, "eps2": 1e-6, "min_split_round": 1, "split_timing": "criteria"}
    algorithm = make(strategy_class("cfl"), TWO_GROUPS, **always)
    drive_round(algorithm, 1, by_group(TWO_GROUPS, noise=0.2))
    assert len(algorithm.state.splits) == 1
    hand(algorithm).clients["9"] = type(hand(algorithm).clients["0"])("9", 50, 0)
    hand(algorithm).active = [*TWO_GROUPS, "9"]
    placement, *_ = drive_round(algorithm, 2, by_group({**TWO_GROUPS, "9": 0}, noise=0.2, seed=3))
    assert [a.key for a in placement] == ["9"] and placement[0].config["phase"] == "placement"
    assert algorithm.assignment["9"] == algorithm.assignment["0"]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_state_round_trip_continues_identically(name):
    """get_state after round 2, set_state into a fresh algorithm: round 3 gives the same models."""
    def run(algorithm, rounds):
        for r in rounds:
            drive_round(algorithm, r, by_group(TWO_GROUPS, seed=r))

    stats = {k: {"num-classes": 2, "label-entropy": 1.0} for k in TWO_GROUPS}
    options = {"stats": stats, "fraction_train": 0.5}
    straight = make(strategy_class(name), TWO_GROUPS, **options)
    run(straight, [1, 2, 3])
    first = make(strategy_class(name), TWO_GROUPS, **options)
    run(first, [1, 2])
    resumed = make(strategy_class(name), TWO_GROUPS, **options)
    resumed.set_state(first.get_state())
    run(resumed, [3])
    assert resumed.assignment == straight.assignment
    assert sorted(resumed.models) == sorted(straight.models)
    for cluster, model in straight.models.items():
        for n, v in model.items():
            np.testing.assert_array_equal(resumed.models[cluster][n], v)
