"""The CFL family's paper presets (``Cls(**Cls.PAPER)``): the published algorithm with no
extension, checked on hand-made updates whose right answer is known from the paper's rule."""

import numpy as np
import pytest
from harness import hand, round_of
from test_cfl import DIM, arrays_of

from clusterfed.strategies.base import steps
from clusterfed.strategies.cfl import CFL
from clusterfed.core.exchange import ClientInfo, TrainReply
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.strategies.layercfl import LayerCFL

E = np.eye(DIM)


def paper(cls, keys, **overrides):
    strategy = cls(**{**cls.PAPER, **overrides})
    hand(strategy).train_config = {"lr": 0.05, "local-epochs": 1}
    strategy.init(arrays_of(np.zeros(DIM)), hand(strategy).train_config)
    for key in keys:
        hand(strategy).clients[key] = ClientInfo(key, 50, None)
    hand(strategy).active = list(keys)
    assert list(steps(strategy.admit(round_of(strategy, 1), list(keys)))) == []
    return strategy


def run_round(strategy, server_round, vectors):
    replies = [TrainReply(key=k, cluster=strategy.assignment[k], arrays=arrays_of(v),
                          sent=strategy.models[strategy.assignment[k]], num_examples=50, train_loss=0.0,
                          metrics={}, is_update=True) for k, v in vectors.items()]
    return strategy.after_train(round_of(strategy, server_round), replies)


def sides(strategy):
    return sorted(sorted(side) for side in strategy.state.splits[-1]["members"])


@pytest.mark.parametrize("cls", [CFL, LayerCFL, HiCFL])
def test_the_preset_names_fields_and_switches_every_extension_off(cls):
    strategy = cls(**cls.PAPER)
    assert set(cls.PAPER) <= set(cls.Params.model_fields)
    assert all(getattr(strategy.params, name) == value for name, value in cls.PAPER.items())
    assert strategy.params.merge is False and strategy.params.update_storage == "exact"
    assert strategy.params.split_timing == "criteria" and strategy.params.same_round_splits is False


# ------------------------------------------------------------ CFL, Algorithm 1
# two groups pulling opposite ways: mean update 0 < eps1 = 0.4, max norm 2 > eps2 = 1.6
OPPOSITE = {"0": 2 * E[0], "1": 2 * E[0], "2": -2 * E[0], "3": -2 * E[0]}


def test_cfl_paper_splits_by_sattlers_absolute_criteria_from_round_20():
    strategy = paper(CFL, OPPOSITE)
    run_round(strategy, 19, OPPOSITE)  # the reference code's earliest split round is 20
    assert strategy.state.splits == []
    run_round(strategy, 20, OPPOSITE)
    assert sides(strategy) == [["0", "1"], ["2", "3"]]
    criterion = strategy.state.splits[0]["criterion"]
    assert criterion["mode"] == "absolute" and criterion["mean_norm"] == pytest.approx(0.0)
    assert criterion["max_norm"] == pytest.approx(2.0)


def test_cfl_paper_keeps_a_cluster_whose_largest_update_is_below_eps2():
    small = {k: 0.75 * v for k, v in OPPOSITE.items()}  # max norm 1.5 < eps2 = 1.6: not heterogeneous
    strategy = paper(CFL, small)
    run_round(strategy, 20, small)
    assert strategy.state.splits == [] and strategy.state.refused == []


def test_cfl_paper_keeps_every_proposed_split_without_an_acceptance_test():
    # four directions at right angles: no two groups, no better within a side than across
    square = {"0": 2 * E[0], "1": -2 * E[0], "2": 2 * E[1], "3": -2 * E[1]}
    strategy = paper(CFL, square)
    run_round(strategy, 20, square)
    (split,) = strategy.state.splits
    # no separation (within-side cosine 0 = the largest across: Gap 0), yet kept: nothing to pass
    assert split["required_silhouette"] == -1.0 and split["gap"] == pytest.approx(0.0)
    assert strategy.state.refused == []


# ------------------------------------------------------------ LayerCFL, Algorithm 2
def test_layercfl_paper_compares_every_layer_and_enforces_the_correct_clustering_check():
    strategy = paper(LayerCFL, OPPOSITE)
    assert strategy.decision_names() == list(strategy.state.theta0)  # unknown skew: all layers
    run_round(strategy, 20, OPPOSITE)
    # across the sides α_cross_max = -1, so the bound sqrt((1 - α)/2) = 1 > γ_max = 0 (equal updates)
    check = strategy.state.splits[0]["check"]
    assert check["passed"] and check["bound"] == pytest.approx(1.0) and check["gamma_max"] == pytest.approx(0.0)
    assert sides(strategy) == [["0", "1"], ["2", "3"]]


def test_layercfl_paper_refuses_a_split_that_fails_theorem_1():
    square = {"0": 2 * E[0], "1": -2 * E[0], "2": 2 * E[1], "3": -2 * E[1]}
    strategy = paper(LayerCFL, square)
    run_round(strategy, 20, square)
    (refused,) = strategy.state.refused
    assert refused["reason"] == "check" and not refused["check"]["passed"]
    alpha = refused["check"]["alpha_cross_max"]
    assert refused["check"]["bound"] == pytest.approx(np.sqrt((1 - alpha) / 2))
    assert refused["check"]["gamma_max"] >= refused["check"]["bound"]
    assert strategy.state.splits == []


# ------------------------------------------------------------ HiCFL
def noisy(directions, rng, noise=0.02):
    return {k: d + noise * rng.standard_normal(DIM) for k, d in directions.items()}


def test_hicfl_paper_splits_on_the_reference_sign_once_every_member_is_stable():
    rng = np.random.default_rng(0)
    ones = 2 * np.ones(DIM) / np.sqrt(DIM)  # every layer pulls the group's way
    groups = {"0": ones, "1": ones, "2": ones, "3": -ones, "4": -ones, "5": -ones}
    strategy = paper(HiCFL, groups)
    assert strategy.state.epsilon == pytest.approx(0.5 * 0.05) and strategy.state.xi == pytest.approx(0.05 * 0.05)
    for server_round in range(1, 13):
        run_round(strategy, server_round, noisy(groups, rng))
        if strategy.state.splits:
            break
    (split,) = strategy.state.splits
    assert sides(strategy) == [["0", "1", "2"], ["3", "4", "5"]]
    assert split["rule"] == "reference" and split["centred"] is False and split["layer"] == "conv1"
    # every member below ε (timing = all), the reference the most stable one
    assert max(split["stability"].values()) < strategy.state.epsilon
    assert split["reference"] == min(split["stability"], key=split["stability"].get)


def test_hicfl_paper_stop_rule_keeps_a_cluster_whose_updates_agree():
    rng = np.random.default_rng(1)
    ones = np.ones(DIM) / np.sqrt(DIM)  # norm 1 < eps2 = 1.6: not heterogeneous
    groups = {str(i): (ones if i < 3 else -ones) for i in range(6)}
    strategy = paper(HiCFL, groups)
    for server_round in range(1, 13):
        run_round(strategy, server_round, noisy(groups, rng))
    assert strategy.state.splits == []
    assert strategy.state.no_split and {n["code"] for n in strategy.state.no_split} == {"agree"}
