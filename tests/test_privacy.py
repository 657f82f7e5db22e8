"""Differential privacy per cluster (clusterfed.privacy): clipping bounds each update, the
noise on each cluster's average has std noise_multiplier * clipping_norm / m, ε is Flower's
RDP accountant's for each client's releases, bad settings are refused before round 1, and
Flower's DP wrappers around a clustered strategy stop with one message naming the dp_* parameters."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from harness import hand, round_of

import clusterfed
from clusterfed import privacy
from clusterfed.config import ConfigError, parse_config
from clusterfed.strategies.base import StrategyParamsError
from clusterfed.core.exchange import TrainReply

SIZE = 20_000  # elements per test array: a sample std within a few percent


@pytest.fixture
def accounting():
    """Noise needs the accountant's backend, dp-accounting (clusterfed[privacy], in .[dev])."""
    pytest.importorskip("dp_accounting", reason="ε needs clusterfed[privacy]")


def strategy_with(members: dict[int, list[str]], **dp):
    """FedAvg with the dp_* parameters and clusters ``members`` (cluster -> client keys), all at zero."""
    strategy = clusterfed.FedAvg(**dp)
    strategy.init({"w": np.zeros(SIZE, np.float32), "count": np.array(3, np.int64)})
    for cluster in members:
        if cluster not in strategy.models:
            strategy.models[cluster] = {k: v.copy() for k, v in strategy.models[0].items()}
    strategy.state.assignment = {key: cluster for cluster, keys in members.items() for key in keys}
    hand(strategy).active = sorted(strategy.assignment)
    return strategy


def reply(strategy, key: str, update: np.ndarray, num_examples: int = 10, count: int = 9) -> TrainReply:
    cluster = strategy.assignment[key]
    sent = strategy.models[cluster]
    return TrainReply(key, cluster, {"w": (sent["w"] + update).astype(np.float32), "count": np.array(count, np.int64)},
                      sent, num_examples, None, {})


def test_noise_std_per_cluster_is_noise_multiplier_times_clipping_norm_over_its_replies(accounting):
    members = {0: ["a", "b", "c", "d"], 1: [f"x{i}" for i in range(10)]}
    strategy = strategy_with(members, dp_noise_multiplier=0.8, dp_clipping_norm=2.0, dp_delta=1e-4)
    diagnostics = strategy.aggregate_clusters([reply(strategy, k, np.zeros(SIZE)) for keys in members.values()
                                               for k in keys])
    for cluster, keys in members.items():
        expected = 0.8 * 2.0 / len(keys)
        noise = strategy.models[cluster]["w"].astype(np.float64)  # the replies did not move: all of it is noise
        assert abs(noise.mean()) < 5 * expected / np.sqrt(SIZE)
        assert noise.std() == pytest.approx(expected, rel=0.03)
        report = diagnostics["privacy"]["clusters"][str(cluster)]
        assert report["noise_std"] == pytest.approx(expected) and report["sampled"] == len(keys)
        assert strategy.models[cluster]["count"] == 3  # an integer array keeps the cluster's value: no noise on it


def test_noise_is_drawn_from_the_strategy_seed(accounting):
    def noised(seed):
        strategy = strategy_with({0: ["a", "b"]}, seed=seed, dp_noise_multiplier=1.0, dp_clipping_norm=1.0,
                                 dp_delta=1e-3)
        strategy.aggregate_clusters([reply(strategy, k, np.zeros(SIZE)) for k in "ab"])
        return strategy.models[0]["w"]

    assert np.array_equal(noised(3), noised(3)) and not np.array_equal(noised(3), noised(4))


def test_clipping_bounds_each_update_and_the_replies_weigh_the_same():
    strategy = strategy_with({0: ["big", "small"]}, dp_clipping_norm=1.0)  # clipping only: no noise
    rng = np.random.default_rng(0)
    big, small = rng.normal(0, 1, SIZE) * 5, np.full(SIZE, 1e-4)
    replies = [reply(strategy, "big", big, num_examples=1000), reply(strategy, "small", small, num_examples=1)]
    diagnostics = strategy.aggregate_clusters(replies)
    norms = [np.linalg.norm(r.update["w"].astype(np.float64)) for r in replies]
    assert norms[0] == pytest.approx(1.0, rel=1e-5) and norms[1] == pytest.approx(np.linalg.norm(small), rel=1e-4)
    # later clustering steps read the clipped update; the integer array is not taken from the client
    assert replies[0].arrays["count"] == 3
    clipped_big = big / np.linalg.norm(big)
    np.testing.assert_allclose(strategy.models[0]["w"], (clipped_big + small) / 2, atol=1e-6)  # equal weights
    assert "privacy" not in diagnostics  # no noise, nothing to account


def test_a_reply_sent_as_an_update_is_clipped_as_an_update():
    strategy = strategy_with({0: ["a"]}, dp_clipping_norm=0.5)
    sent = strategy.models[0]
    update = np.full(SIZE, 1.0, np.float32)
    one = TrainReply("a", 0, {"w": update.copy(), "count": np.array(0, np.int64)}, sent, 5, None, {}, is_update=True)
    strategy.aggregate_clusters([one])
    assert one.is_update and np.linalg.norm(one.arrays["w"]) == pytest.approx(0.5, rel=1e-5)
    assert np.linalg.norm(strategy.models[0]["w"]) == pytest.approx(0.5, rel=1e-5)


def test_train_asks_carry_the_clipping_norm_under_flowers_key(accounting):
    strategy = strategy_with({0: ["a"]}, dp_noise_multiplier=1.0, dp_clipping_norm=3.0, dp_delta=1e-3)
    (ask,) = strategy.train_asks(round_of(strategy, 1), ["a"])
    from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

    assert ask.config[KEY_CLIPPING_NORM] == 3.0
    plain_strategy = strategy_with({0: ["a"]})
    (plain,) = plain_strategy.train_asks(round_of(plain_strategy, 1), ["a"])
    assert KEY_CLIPPING_NORM not in plain.config  # without DP a fixedclipping_mod client errs, as with Flower's FedAvg


def flower_epsilon(noise_multiplier: float, delta: float, releases: int) -> float:
    from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    accountant = RdpAccountant(PrivacyConfig(target_delta=delta, population_size=20,
                                             neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                             sampling_method=SamplingMethod.NO_AMPLIFICATION))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, 4, 20), releases)
    return accountant.get_privacy_spent().epsilon


def test_epsilon_is_flowers_rdp_accountant_and_grows_with_rounds(accounting):
    members = {0: ["a", "b"], 1: ["c", "d", "e"]}
    strategy = strategy_with(members, dp_noise_multiplier=1.1, dp_clipping_norm=1.0, dp_delta=1e-5)
    epsilons = []
    for server_round in range(1, 5):
        trainers = ["a", "b", "c", "d", "e"] if server_round < 4 else ["a", "b"]  # cluster 1 sits out round 4
        report = strategy.aggregate_clusters([reply(strategy, k, np.zeros(SIZE)) for k in trainers])["privacy"]
        epsilons.append(report["epsilon"])
        assert report["epsilon"] == pytest.approx(flower_epsilon(1.1, 1e-5, server_round))
    assert epsilons == sorted(epsilons) and len(set(epsilons)) == 4
    clusters = strategy.final_clusters()["privacy"]["clusters"]
    assert clusters["0"]["epsilon"] == pytest.approx(flower_epsilon(1.1, 1e-5, 4))
    assert clusters["1"]["epsilon"] == pytest.approx(flower_epsilon(1.1, 1e-5, 3))


def test_a_client_that_moves_clusters_is_charged_for_every_release_it_entered(accounting):
    strategy = strategy_with({0: ["a", "b"], 1: ["c"]}, dp_noise_multiplier=1.0, dp_clipping_norm=1.0, dp_delta=1e-3)
    strategy.aggregate_clusters([reply(strategy, k, np.zeros(SIZE)) for k in "abc"])
    strategy.assignment["a"] = 1  # a moves to cluster 1
    report = strategy.aggregate_clusters([reply(strategy, k, np.zeros(SIZE)) for k in "ac"])["privacy"]
    assert strategy.state.dp_releases == {"a": 2, "b": 1, "c": 2}
    assert report["clusters"]["0"]["epsilon"] == pytest.approx(flower_epsilon(1.0, 1e-3, 1))
    assert report["epsilon"] == report["clusters"]["1"]["epsilon"] == pytest.approx(flower_epsilon(1.0, 1e-3, 2))
    assert "dp_releases" in strategy.get_state()  # checkpointed with the rest of the state


@pytest.mark.parametrize("dp, says", [
    ({"dp_noise_multiplier": 1.0}, "without dp_clipping_norm"),
    ({"dp_noise_multiplier": 1.0, "dp_clipping_norm": 1.0}, "without dp_delta"),
    ({"dp_clipping_norm": 1.0, "dp_delta": 1e-3}, "without dp_noise_multiplier"),
    ({"dp_noise_multiplier": -1.0}, "greater than or equal to 0"),
    ({"dp_delta": 1.0}, "less than 1"),
])
def test_dp_settings_that_cannot_work_are_refused_by_the_constructor(dp, says):
    with pytest.raises(StrategyParamsError, match=says):
        clusterfed.FedClust(**dp)


def test_a_delta_of_one_over_the_clients_or_more_is_refused_before_any_client_is_asked(accounting):
    strategy = strategy_with({0: [f"c{i}" for i in range(20)]}, dp_noise_multiplier=1.0, dp_clipping_norm=1.0,
                             dp_delta=0.05)
    with pytest.raises(StrategyParamsError, match=r"not below 1/n = 0.05 for n = 20 clients"):
        next(strategy.round(round_of(strategy, 1)))


@pytest.mark.parametrize("keys, says", [
    ({"dp-noise-multiplier": 0.5}, "dp-noise-multiplier = 0.5 without dp-clipping-norm"),
    ({"dp-noise-multiplier": 0.5, "dp-clipping-norm": 1.0}, "without dp-delta"),
    ({"dp-noise-multiplier": 0.5, "dp-clipping-norm": 1.0, "dp-delta": 0.1, "num-clients": 20}, "1/n = 0.05"),
    ({"strategy": "flwr-fedavg", "dp-clipping-norm": 1.0}, "does not take the dp-"),
])
def test_the_run_config_refuses_the_same_settings_before_the_run(keys, says):
    with pytest.raises(ConfigError, match=says):
        parse_config({"strategy": "cfl", **keys})


def test_the_run_config_hands_the_dp_keys_to_the_strategy(accounting):
    config = parse_config({"strategy": "cfl", "dp-noise-multiplier": 0.7, "dp-clipping-norm": 2.0, "dp-delta": 1e-3})
    assert config.build_strategy().dp == privacy.ClusterDP(0.7, 2.0, 1e-3)


def test_the_dp_settings_are_checked_once_on_each_path_with_one_sentence(monkeypatch, accounting):
    """The run config and the Python constructor both check the dp_* settings in the strategy's
    Params, once; the strategy built from a run config's Params does not check them again.
    Both refusals are the same sentence, naming the strategy and each setting as its caller
    spells it."""
    checks = []
    real = privacy.dp_settings

    def counting(*args):
        checks.append(args)
        return real(*args)

    monkeypatch.setattr(privacy, "dp_settings", counting)
    config = parse_config({"strategy": "cfl", "dp-noise-multiplier": 0.7, "dp-clipping-norm": 2.0, "dp-delta": 1e-3})
    assert config.build_strategy().dp == privacy.ClusterDP(0.7, 2.0, 1e-3)
    assert checks == [(0.7, 2.0, 1e-3)]  # before: twice (the run config's check, the constructor's)
    checks.clear()
    assert clusterfed.FedClust(dp_noise_multiplier=0.7, dp_clipping_norm=2.0, dp_delta=1e-3).dp is not None
    assert checks == [(0.7, 2.0, 1e-3)]
    with pytest.raises(StrategyParamsError) as from_python:
        clusterfed.CFL(dp_clipping_norm=1.0, dp_delta=1e-3)
    with pytest.raises(ConfigError) as from_config:
        parse_config({"strategy": "cfl", "dp-clipping-norm": 1.0, "dp-delta": 1e-3})
    said = "cfl: dp_delta = 0.001 without dp_noise_multiplier: without noise ε is infinite"
    assert str(from_python.value).startswith(said)
    assert str(from_config.value).startswith(said.replace("_", "-"))


def test_dp_with_another_aggregator_is_refused_by_the_run_config_before_the_run():
    with pytest.raises(ConfigError, match=r"fedclust: dp-\* with aggregator = 'FedAdam'"):
        parse_config({"strategy": "fedclust", "dp-clipping-norm": 1.0, "aggregator": "fedadam"})
    with pytest.raises(StrategyParamsError, match=r"fedclust: dp_\* with aggregator = 'FedAdam'"):
        clusterfed.FedClust(dp_clipping_norm=1.0, aggregator="fedadam")


@pytest.mark.parametrize("wrapper", ["DifferentialPrivacyServerSideFixedClipping",
                                     "DifferentialPrivacyClientSideFixedClipping"])
def test_flowers_dp_wrapper_around_a_clustered_strategy_names_the_clustered_alternative(wrapper):
    """What a user writes after Flower's DP guide: the wrapper around FedClust, started on a
    grid. It stops before any message with one message naming FedClust's dp_* parameters."""
    import flwr.serverapp.strategy as flower
    from flwr.supercore.task_identity import TaskIdentity
    from userapp.client_app import app as stock_client_app
    from userapp.task import Net

    from clusterfed.runner.inprocess import InProcessGrid

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(stock_client_app, 4, node_configs=[{"partition-id": i} for i in range(4)])
    wrapped = getattr(flower, wrapper)(clusterfed.FedClust(), noise_multiplier=0.01, clipping_norm=100.0,
                                       num_sampled_clients=4)
    with pytest.raises(StrategyParamsError) as error:
        wrapped.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=1)
    message = str(error.value)
    assert f"Flower's {wrapper} cannot wrap the clustered strategy 'FedClust'" in message
    assert "FedClust(dp_noise_multiplier=..., dp_clipping_norm=..., dp_delta=...)" in message
    assert not grid.pending  # nothing was sent


def test_a_stock_client_with_flowers_fixedclipping_mod_trains_under_clustered_dp(accounting):
    """The clipping norm travels in the train config, where Flower's fixedclipping_mod reads
    it: every reply is accepted, and the run reports ε."""
    import torch
    from flwr.clientapp import ClientApp
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.supercore.task_identity import TaskIdentity
    from userapp import client_app
    from userapp.task import Net

    from clusterfed.runner.inprocess import InProcessGrid

    app = ClientApp()
    app.train(mods=[fixedclipping_mod])(client_app.train_fn)  # Flower's way: the mod on train messages
    app.evaluate()(client_app.evaluate_fn)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(app, 4, node_configs=[{"partition-id": i} for i in range(4)])
    torch.manual_seed(0)
    strategy = clusterfed.FedAvg(dp_noise_multiplier=0.5, dp_clipping_norm=1.0, dp_delta=1e-3)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=2,
                            train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}))
    assert result.train_metrics_clientapp[2]["num-examples"] == 4 * 72  # all four replies accepted
    assert result.clustering["privacy"]["epsilon"] == pytest.approx(flower_epsilon(0.5, 1e-3, 2))


def test_ifca_seeded_from_clients_models_is_refused_under_dp_before_any_work():
    with pytest.raises(StrategyParamsError, match="init = 'random'"):
        clusterfed.IFCA(init="kmeans++", dp_clipping_norm=1.0)
    with pytest.raises(ConfigError, match="init = 'random'"):  # a run config: at parsing, before round 1
        parse_config({"strategy": "ifca", "ifca.init": "kmeans++", "dp-clipping-norm": 1.0, "num-clients": 8})


def test_the_release_ledger_and_noise_generator_resume_from_a_checkpoint(accounting):
    """A resumed run draws the same noise and charges the same releases as one never stopped."""
    from clusterfed.runner.canonical_json import dumps_json, loads_json
    from clusterfed.runner.state_codec import decode, encode

    def step(strategy):
        strategy.aggregate_clusters([reply(strategy, k, np.zeros(SIZE)) for k in "ab"])
        return strategy.models[0]["w"].copy()

    dp = {"dp_noise_multiplier": 1.0, "dp_clipping_norm": 1.0, "dp_delta": 1e-3}
    straight = strategy_with({0: ["a", "b"]}, **dp)
    step(straight)
    tree, arrays = encode(straight.get_state())
    resumed = strategy_with({0: ["a", "b"]}, **dp)
    resumed.set_state(decode(loads_json(dumps_json(tree)), arrays))
    assert np.array_equal(step(straight), step(resumed))
    assert resumed.state.dp_releases == straight.state.dp_releases == {"a": 2, "b": 2}
