"""Flower's aggregation strategies inside each cluster: per-cluster optimiser state, robust
aggregation of a cluster with an attacker, the fallback for a cluster too small, bad
aggregator settings refused, and a resumed run bit-identical with a server optimiser."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAdam, FedAvgM, Krum

from clusterfed import CFL, FedClust
from clusterfed.config import ConfigError, parse_config
from clusterfed.runner.checkpoint import load_checkpoint
from clusterfed.simulation import simulate
from clusterfed.strategies import strategy_class
from clusterfed.core.aggregation import AggregatorError, ClusterAggregator
from clusterfed.strategies.base import StrategyParamsError

from harness import drive_round, make, round_of, theta0

GROUPS = {str(i): i % 2 for i in range(10)}  # two true groups of five


def step_for(group: int) -> float:
    return 1.0 if group == 0 else -0.5


def honest(ask):
    """Each client moves every weight by its group's step."""
    return {k: v + step_for(GROUPS[ask.key]) for k, v in ask.model.items()}


def flower_fedadam_alone(rounds: int, step: float) -> dict[str, np.ndarray]:
    """The model Flower's FedAdam (eta=0.1) reaches stepping one cluster alone from θ0."""
    aggregator = ClusterAggregator(FedAdam(eta=0.1))
    model, state = theta0(), None
    for _ in range(rounds):
        trained = [{k: v + step for k, v in model.items()} for _ in range(5)]
        model, state, _ = aggregator.aggregate(model, trained, [50] * 5, state)
    return model


def test_fedadam_keeps_one_optimiser_state_per_cluster():
    oracle = make(strategy_class("oracle"), GROUPS, aggregator="fedadam(eta=0.1)")
    for server_round in (1, 2, 3):
        drive_round(oracle, server_round, honest)
    states = oracle.state.aggregator_state
    assert sorted(states) == sorted(set(oracle.assignment.values())) and len(states) == 2
    a, b = (states[c]["attributes"] for c in sorted(states))
    assert states[0]["steps"] == states[1]["steps"] == 3
    # the clusters moved opposite ways, so their first moments point opposite ways
    assert np.all(a["m_t"]["fc1.bias"] > 0) and np.all(b["m_t"]["fc1.bias"] < 0)
    for cluster in sorted(states):
        group = GROUPS[oracle.members(round_of(oracle, 3), cluster)[0]]
        expected = flower_fedadam_alone(3, step_for(group))
        for name, value in oracle.models[cluster].items():
            np.testing.assert_array_equal(value, expected[name])
            assert value.dtype == np.float32


def test_fedavgm_momentum_is_the_clusters_own_and_split_children_inherit_it():
    cfl = CFL(aggregator=FedAvgM(server_momentum=0.9))
    cfl.init(theta0())
    parent = min(cfl.models)
    cfl.state.aggregator_state[parent] = {"aggregator": "FedAvgM", "steps": 4,
                                    "attributes": {"momentum_vector": [np.ones(2, np.float32)]}}
    child = cfl.new_cluster(cfl.models[parent], inherit=parent)
    fresh = cfl.new_cluster(cfl.models[parent])
    assert cfl.state.aggregator_state[child]["steps"] == 4
    assert cfl.state.aggregator_state[child]["attributes"]["momentum_vector"] is not \
        cfl.state.aggregator_state[parent]["attributes"]["momentum_vector"]
    assert fresh not in cfl.state.aggregator_state


@pytest.mark.parametrize("spec", ["fedmedian", "fedtrimmedavg(beta=0.2)", "krum(num_malicious_nodes=1)",
                                  "multikrum(num_malicious_nodes=1, num_nodes_to_select=3)"])
def test_a_robust_aggregator_rejects_a_sign_flipped_client_in_its_cluster(spec):
    attacker = "0"  # one of group 0's five members sends its update sign-flipped and scaled

    def respond(ask):
        if ask.key == attacker:
            return {k: v - 10.0 * step_for(0) for k, v in ask.model.items()}
        return honest(ask)

    robust = make(strategy_class("oracle"), GROUPS, aggregator=spec)
    plain = make(strategy_class("oracle"), GROUPS)
    diagnostics = drive_round(robust, 1, respond).diagnostics
    drive_round(plain, 1, respond)
    cluster = robust.assignment[attacker]
    for name, value in robust.models[cluster].items():
        np.testing.assert_allclose(value, theta0()[name] + step_for(0), rtol=0, atol=1e-6)
    # the weighted mean is dragged the attacker's way: (4 * 1 - 10) / 5
    np.testing.assert_allclose(plain.models[plain.assignment[attacker]]["fc1.bias"], -1.2, rtol=1e-6)
    assert "aggregator_fallback" not in diagnostics


def test_a_cluster_too_small_for_krum_is_averaged_with_the_reason_recorded():
    groups = {"0": 0, "1": 0, "2": 0, "3": 1, "4": 1, "5": 1, "6": 1, "7": 1}
    krum = make(strategy_class("oracle"), groups, aggregator="krum(num_malicious_nodes=1)")
    diagnostics = drive_round(krum, 1, lambda ask: {k: v + float(ask.key) for k, v in ask.model.items()}).diagnostics
    small, large = krum.assignment["0"], krum.assignment["3"]
    reason = diagnostics["aggregator_fallback"]
    assert list(reason) == [str(small)] and "needs at least 5 replies" in reason[str(small)]
    np.testing.assert_allclose(krum.models[small]["fc1.bias"], 1.0)  # mean of 0, 1, 2
    assert float(krum.models[large]["fc1.bias"][0]) in (3.0, 4.0, 5.0, 6.0, 7.0)  # one member, chosen


def test_integer_buffers_keep_their_dtype_and_are_averaged():
    aggregator = ClusterAggregator(FedAdam(eta=0.1))
    model = {"w": np.zeros(3, np.float32), "num_batches_tracked": np.asarray(4, np.int64)}
    trained = [{"w": np.ones(3, np.float32), "num_batches_tracked": np.asarray(n, np.int64)} for n in (6, 8)]
    new, state, _ = aggregator.aggregate(model, trained, [1, 1], None)
    assert new["num_batches_tracked"].dtype == np.int64 and new["num_batches_tracked"].shape == ()
    assert int(new["num_batches_tracked"]) == 7 and new["w"].dtype == np.float32
    assert set(state["attributes"]) == {"m_t", "v_t"}  # current_arrays is the model, not state


@pytest.mark.parametrize("value, message", [
    ("krumm", "no Flower aggregation strategy is named 'krumm'"),
    ("fedadam(etta=0.1)", "FedAdam has no option 'etta'; its options: eta, eta_l, beta_1, beta_2, tau"),
    ("fedadam(min_train_nodes=3)", "option 'min_train_nodes' is clusterfed's to set"),
    ("fedtrimmedavg(beta=0.6)", "beta"),
    ("qfedavg", "QFedAvg cannot aggregate within a cluster"),
    ("krum(num_malicious_nodes=-1)", "num_malicious_nodes = -1"),
    ("__import__('os')", "is not a name or name(option=value, ...)"),
])
def test_bad_aggregator_settings_are_refused_with_one_message(value, message):
    with pytest.raises(ConfigError, match="config key 'aggregator'") as error:
        parse_config({"strategy": "fedclust", "aggregator": value})
    assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(StrategyParamsError, match="aggregator"):
        FedClust(aggregator=value)


def test_a_clustered_strategy_is_no_aggregator_and_a_changed_aggregator_does_not_resume():
    with pytest.raises(StrategyParamsError, match="FedClust is not a Flower aggregation strategy"):
        CFL(aggregator=FedClust())
    state = ClusterAggregator(FedAdam()).fresh_state()
    with pytest.raises(AggregatorError, match="made by 'FedAdam', the aggregator is 'Krum'"):
        ClusterAggregator(Krum()).aggregate(theta0(), [theta0()], [1], copy.deepcopy(state))


CFL_RUN = {"strategy": "cfl", "rounds": 4, "batch-size": 32, "partitioner": "rotation", "num-clients": 8,
           "cfl.split-criteria": "absolute", "cfl.eps1": 100.0, "cfl.eps2": 0.001, "cfl.split-min-silhouette": 0.0,
           "cfl.min-split-round": 2, "aggregator": "fedadam(eta=0.01)"}


@pytest.mark.end_to_end
def test_a_resumed_run_with_fedadam_per_cluster_is_bit_identical(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    simulate(parse_config({**CFL_RUN, "out-dir": str(straight)}), engine="inprocess", stream=None)
    simulate(parse_config({**CFL_RUN, "out-dir": str(stopped), "rounds": 2}), engine="inprocess", stream=None)
    saved = load_checkpoint(stopped)["algorithm"]["aggregator_state"]
    assert saved and all(s["aggregator"] == "FedAdam" and "m_t" in s["attributes"] for s in saved.values())
    simulate(parse_config({**CFL_RUN, "out-dir": str(stopped), "resume-from": str(stopped)}),
             engine="inprocess", stream=None)
    drop = ("round_seconds", "clustering_seconds")
    rows = [[{k: v for k, v in json.loads(line).items() if k not in drop}
             for line in (d / "rounds.jsonl").read_text().splitlines()] for d in (straight, stopped)]
    assert rows[0] == rows[1] and len(rows[0]) == 4
    a, b = (load_checkpoint(d)["algorithm"] for d in (straight, stopped))
    assert a["assignment"] == b["assignment"] and len(a["models"]) >= 2  # CFL split; children kept optimising
    assert a["models"].keys() == b["models"].keys() and a["aggregator_state"].keys() >= a["models"].keys()
    for cluster in a["models"]:
        assert a["aggregator_state"][cluster]["steps"] == b["aggregator_state"][cluster]["steps"] == 4
        for name, value in a["models"][cluster].items():
            assert value.tobytes() == b["models"][cluster][name].tobytes()
        for name, value in a["aggregator_state"][cluster]["attributes"]["v_t"].items():
            assert value.tobytes() == b["aggregator_state"][cluster]["attributes"]["v_t"][name].tobytes()


def test_an_attacker_sends_its_update_flipped_or_scaled_and_stays_one_all_run():
    from clusterfed.faults import attack, is_attacker

    sent = {"w": np.ones(2, np.float32), "n": np.asarray(3, np.int64)}
    trained = {"w": np.asarray([2.0, 0.0], np.float32), "n": np.asarray(5, np.int64)}
    flipped = attack(trained, sent, {"fault-attack": "sign-flip", "fault-attack-factor": 4.0}, is_update=False)
    np.testing.assert_array_equal(flipped["w"], [-3.0, 5.0])  # 1 - 4 × (±1)
    assert flipped["w"].dtype == np.float32 and int(flipped["n"]) == 5  # counters untouched
    scaled = attack({"w": np.asarray([0.5, -0.5], np.float32)}, {}, {"fault-attack": "scale", "fault-attack-factor": 4.0},
                    is_update=True)
    np.testing.assert_array_equal(scaled["w"], [2.0, -2.0])
    config = {"seed": 3, "fault-attackers": 0.2, "num-clients": 20}
    chosen = [k for k in map(str, range(20)) if is_attacker(config, k)]
    assert len(chosen) == 4 and chosen == [k for k in map(str, range(20)) if is_attacker(config, k)]
    assert chosen != [k for k in map(str, range(20)) if is_attacker({**config, "seed": 4}, k)]
    assert not any(is_attacker({"seed": 3, "num-clients": 20}, k) for k in map(str, range(20)))
