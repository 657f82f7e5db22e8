"""Secure aggregation in the round: the strategies run SecAgg+ per cluster over the in-process
engine (the built-in ClientApp, which carries ``clusterfed.secagg.secagg_mod``), and the run
ends as the plain run does, within the quantization error, while no individual update reaches
the server's aggregation code.

The quantization error: each value of a cluster's weighted mean is off by less than
2 r / steps (``secagg-clipping-range`` r = 8, ``secagg-quantization-range`` steps = 2**24:
9.5e-7) per round of aggregation, plus the float32 rounding of the model's dtype. Over a run
the next round trains from the slightly different model, so a run of R rounds is compared at
R * 2 r / steps * 10 (measured: 1.6e-6 after 3 FedAvg rounds).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.supercore.task_identity import TaskIdentity

import clusterfed
from clusterfed import protocol
from clusterfed.core.exchange import GroupSum
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.strategies.base import ClusteredStrategy

STEP = 2 * 8.0 / 2**24  # the defaults' per-round bound on a mean's value


@pytest.fixture
def federation(small_config):
    """run(strategy_instance, rounds=..., clients=..., app=...) -> (strategy, result) on digits,
    two label groups, the built-in ClientApp in process."""
    from clusterfed.client_app import app as builtin_app
    from clusterfed.runner.preflight import preflight

    def run(strategy, rounds=2, clients=6, app=None, **config):
        checked = preflight(small_config(strategy=strategy.name, rounds=rounds, num_clients=clients, **config))
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        grid = InProcessGrid(app or builtin_app, clients)
        result = strategy.start(grid=grid, initial_arrays=checked.initial, **checked.start_args())
        return strategy, result

    return run


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[c][n].astype(np.float64) - b[c][n]))) for c in a for n in a[c])


def test_fedavg_secure_one_round_equals_the_plain_mean_within_the_quantization_error(federation):
    plain, _ = federation(clusterfed.FedAvg(), rounds=1)
    secure, _ = federation(clusterfed.FedAvg(secure_aggregation="secaggplus"), rounds=1)
    assert secure.assignment == plain.assignment
    # one round: the same replies, summed masked; float32's own rounding on top
    assert largest_difference(plain.models, secure.models) < STEP + 1e-6


def test_fedavg_secure_run_ends_as_the_plain_run(federation, caplog):
    plain, _ = federation(clusterfed.FedAvg(), rounds=3)
    with caplog.at_level(logging.INFO, logger="flwr"):
        secure, _ = federation(clusterfed.FedAvg(secure_aggregation=True), rounds=3)
    assert secure.assignment == plain.assignment
    assert largest_difference(plain.models, secure.models) < 3 * STEP * 10
    assert any("secure aggregation: 1 cluster sum of 6 clients" in r.getMessage() for r in caplog.records)


def test_no_individual_update_reaches_the_aggregation(federation, monkeypatch):
    """Instrumented: every path by which a client's own arrays could reach the server's
    aggregation fails the test if it is taken (the reply parser, the per-reply aggregation,
    the weighted mean of replies, the server's DP clipping), every train reply that reaches the
    server is checked to carry no arrays in the clear, and the aggregation is handed group
    sums of at least the minimum size only."""
    from clusterfed import privacy
    from clusterfed.runner import driver, inprocess
    from clusterfed.strategies import base

    def forbidden(*args, **kwargs):
        raise AssertionError("an individual reply reached the server's aggregation code")

    monkeypatch.setattr(driver, "parse_train_reply", forbidden)
    monkeypatch.setattr(ClusteredStrategy, "aggregate_clusters", forbidden)
    monkeypatch.setattr(ClusteredStrategy, "aggregate_cluster", forbidden)
    monkeypatch.setattr(base, "weighted_average", forbidden)
    monkeypatch.setattr(privacy, "clip_replies", forbidden)
    pulled = inprocess.InProcessGrid.pull_messages
    seen = {"train replies": 0}

    def checked_pull(self, *args, **kwargs):
        replies = list(pulled(self, *args, **kwargs))
        for reply in replies:
            if reply.has_content() and reply.metadata.message_type == "train":
                seen["train replies"] += 1
                clear = [name for name, record in reply.content.items()
                         if isinstance(record, ArrayRecord) and name != "clusterfed.secagg.masked" and len(record)]
                assert not clear, f"a train reply carried arrays in the clear: {clear}"
        return replies

    monkeypatch.setattr(inprocess.InProcessGrid, "pull_messages", checked_pull)
    sums_seen = []
    aggregate_sums = ClusteredStrategy.aggregate_sums

    def recording(self, rnd, sums):
        for outcome in sums.values():
            assert isinstance(outcome, GroupSum) and len(outcome.members) >= 3
            sums_seen.append(outcome)
        return aggregate_sums(self, rnd, sums)

    monkeypatch.setattr(ClusteredStrategy, "aggregate_sums", recording)
    strategy, _ = federation(clusterfed.FedAvg(secure_aggregation=True), rounds=2)
    assert len(sums_seen) == 2 and seen["train replies"] == 2 * 6 * 4  # 4 stages, 6 clients, 2 rounds
    assert protocol.ARRAYS not in vars(sums_seen[0])  # a sum holds a mean, never a member's arrays


def capture_means(monkeypatch) -> list:
    """Each secure group's mean next to the plain weighted mean of the same members' trained
    arrays (captured on the client side, where they are: the server never has them)."""
    from clusterfed.client import app as client_app_module
    from clusterfed.core.exchange import weighted_average

    trained: dict[str, tuple] = {}
    original = client_app_module.trained_content

    def capturing(task, context, config, data, received, choice, arrays, metrics):
        content = original(task, context, config, data, received, choice, arrays, metrics)
        key = content[protocol.CLIENT]["client-key"] if "client-key" in content[protocol.CLIENT] else None
        trained[str(key)] = (protocol.from_array_record(content[protocol.ARRAYS]),
                             int(content[protocol.METRICS]["num-examples"]))
        return content

    monkeypatch.setattr(client_app_module, "trained_content", capturing)
    from clusterfed.runner import batched_clients
    monkeypatch.setattr(batched_clients, "trained_content", capturing)
    pairs = []
    aggregate_sums = ClusteredStrategy.aggregate_sums

    def comparing(self, rnd, sums):
        for outcome in sums.values():
            members = [trained[k] for k in outcome.members]
            plain = weighted_average([m[0] for m in members], [m[1] for m in members])
            pairs.append((plain, outcome.mean))
        return aggregate_sums(self, rnd, sums)

    monkeypatch.setattr(ClusteredStrategy, "aggregate_sums", comparing)
    return pairs


def test_fedclust_secure_ends_with_the_plain_assignment_and_each_round_within_the_error(federation, monkeypatch):
    """FedClust: the clustering round uploads its partial evidence in the clear (as plain), the
    training steps are summed per cluster; the same clusters, and every secure cluster mean
    within the quantization error of the plain mean of the same members' replies."""
    plain, _ = federation(clusterfed.FedClust(), rounds=2)
    pairs = capture_means(monkeypatch)
    secure, _ = federation(clusterfed.FedClust(secure_aggregation=True), rounds=2)
    assert secure.assignment == plain.assignment and len(set(plain.assignment.values())) == 2
    assert len(pairs) == 4  # two clusters, two rounds
    for mean_plain, mean_secure in pairs:
        assert largest_difference({0: mean_plain}, {0: mean_secure}) < STEP + 1e-6
    assert largest_difference(plain.models, secure.models) < 1e-3  # training amplifies the rounding a little


def test_ifca_secure_chooses_in_the_clear_and_sums_each_choice(federation, monkeypatch):
    """IFCA: a choice step (no training, no arrays uploaded), then SecAgg+ among each model's
    choosers; the same choices as the plain run, each round's cluster means within the error."""
    plain, _ = federation(clusterfed.IFCA(num_clusters=2), rounds=2)
    pairs = capture_means(monkeypatch)
    secure, _ = federation(clusterfed.IFCA(num_clusters=2, secure_aggregation=True), rounds=2)
    assert secure.assignment == plain.assignment and len(set(plain.assignment.values())) == 2
    assert len(pairs) == 4
    for mean_plain, mean_secure in pairs:
        assert largest_difference({0: mean_plain}, {0: mean_secure}) < STEP + 1e-6
    assert largest_difference(plain.models, secure.models) < 1e-3


def test_ifca_secure_restarts_choose_each_initialisation_and_keep_the_lowest_loss(federation, monkeypatch):
    """IFCA with restarts under secure aggregation: round 1 asks every trainer to choose among
    each initialisation's models (no training), keeps the one whose choices have the lowest
    mean loss, then sums each chosen model's trainers securely."""
    from clusterfed.strategies.ifca import IFCA

    kept, restart = [], IFCA.restart

    def spy(self, rnd, trainers, restarts, asks=None):
        replies, diagnostics = yield from restart(self, rnd, trainers, restarts, asks)
        kept.append((asks, diagnostics))
        return replies, diagnostics

    monkeypatch.setattr(IFCA, "restart", spy)
    secure, _ = federation(clusterfed.IFCA(num_clusters=2, restarts=2, secure_aggregation=True), rounds=2)
    ((asks, diagnostics),) = kept  # round 1 only
    assert asks.__name__ == "choice_asks" and diagnostics["ifca_restart_kept"] in (0, 1)
    assert len(secure.assignment) == 6 and set(secure.assignment.values()) <= {0, 1}


def dropping_app(node: int, stage: str):
    """The built-in ClientApp, except that node ``node`` fails at ``stage`` (a SuperNode gone)."""
    from clusterfed.client_app import app as builtin_app
    from clusterfed.secagg import wire

    def app(message, context):
        record = message.content.get(wire.RECORD) if wire.RECORD in message.content else None
        if context.node_id == node and record is not None and record["stage"] == stage:
            raise ConnectionError("the SuperNode went away")
        return builtin_app(message, context)

    return app


def test_a_client_dropping_after_the_key_exchange_is_tolerated(federation, caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy, _ = federation(clusterfed.FedAvg(secure_aggregation=True), rounds=1,
                                 app=dropping_app(1002, "collect"))
    assert any("secure aggregation: 1 cluster sum of 5 clients (1 dropped out, tolerated)" in r.getMessage()
               for r in caplog.records)
    assert not all(np.array_equal(strategy.models[0][n], strategy.theta0[n]) for n in strategy.theta0)


def test_a_cluster_below_the_minimum_is_held_back_and_said(federation, caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy, _ = federation(clusterfed.FedAvg(secure_aggregation=True, secagg_min_group_size=7), rounds=1)
    line = next(r.getMessage() for r in caplog.records if "[ROUND 1/1]" in r.getMessage())
    assert "cluster 0 held back (6 trainers, below the minimum of 7: not asked to train, model kept" in line
    assert all(np.array_equal(strategy.models[0][n], strategy.theta0[n]) for n in strategy.theta0)


def test_too_many_dropouts_fail_the_group_and_keep_its_model(federation, caplog):
    """Below the threshold after the key exchange: no sum, nothing revealed, the model kept, said."""
    from clusterfed.client_app import app as builtin_app
    from clusterfed.secagg import wire

    def app(message, context):
        if wire.RECORD in message.content and message.content[wire.RECORD]["stage"] == "collect" \
                and context.node_id in (1000, 1001, 1002, 1003):
            raise ConnectionError("gone")
        return builtin_app(message, context)

    from clusterfed import ClientFailureError

    strategy = clusterfed.FedAvg(secure_aggregation=True)
    with caplog.at_level(logging.INFO, logger="flwr"), pytest.raises(ClientFailureError):  # no training accepted
        federation(strategy, rounds=1, app=app)
    line = next(r.getMessage() for r in caplog.records if "[ROUND 1/1]" in r.getMessage())
    assert "cluster 0 failed" in line and "no member's values were revealed" in line and "its model kept" in line
    assert all(np.array_equal(strategy.models[0][n], strategy.theta0[n]) for n in strategy.theta0)


@pytest.mark.parametrize("name", ["CFL", "LayerCFL", "HiCFL", "ClientSelection", "Local"])
def test_strategies_that_read_individual_updates_refuse_before_any_message(name, small_config):
    from clusterfed import StrategyParamsError
    from clusterfed.config import ConfigError

    with pytest.raises(StrategyParamsError, match="secure_aggregation = 'secaggplus' refused"):
        getattr(clusterfed, name)(secure_aggregation=True)
    strategy = getattr(clusterfed, name).name
    with pytest.raises(ConfigError, match=f"'secure-aggregation' = 'secaggplus': {strategy} refuses it"):
        small_config(strategy=strategy, secure_aggregation="secaggplus")


@pytest.mark.parametrize("keys, words", [
    ({"secure_aggregation": "on"}, "must be 'off' or 'secaggplus'"),
    ({"secure_aggregation": "secaggplus", "secagg_threshold": 1}, "threshold as a count must be at least 2"),
    ({"secure_aggregation": "secaggplus", "secagg_shares": 4}, "shares must be odd"),
    ({"secure_aggregation": "secaggplus", "secagg_threshold": 0.3}, "must be in [0.5, 1]"),
    ({"secure_aggregation": "secaggplus", "secagg_min_group_size": 2}, "greater than or equal to 3"),
    ({"secure_aggregation": "secaggplus", "aggregator": "fedmedian"}, "cannot work from"),
    ({"strategy": "flwr-fedavg", "secure_aggregation": "secaggplus"}, "does not take secure-aggregation"),
    ({"strategy": "ifca", "ifca.init": "kmeans++", "secure_aggregation": "secaggplus"}, "use ifca.init = 'random'"),
])
def test_bad_settings_stop_before_round_1(keys, words, small_config):
    from clusterfed.config import ConfigError

    with pytest.raises(ConfigError) as error:
        small_config(**{"strategy": "fedavg", **keys})
    assert words in str(error.value)


def test_distributed_dp_clips_on_the_client_and_noises_each_cluster_sum(federation):
    """dp_* with secure aggregation: the mod clips each update on the client (the server cannot),
    the cluster's mean is of equal weights, as the central path's: clipping only, the two runs
    agree within the quantization error; with noise, the noise goes on the unmasked mean and ε
    is accounted and reported as in the central path."""
    clip = {"dp_clipping_norm": 0.05}
    central, _ = federation(clusterfed.FedAvg(**clip), rounds=1)
    distributed, _ = federation(clusterfed.FedAvg(secure_aggregation=True, **clip), rounds=1)
    assert largest_difference(central.models, distributed.models) < STEP + 1e-6
    update = np.sqrt(sum(float(np.sum((distributed.models[0][n].astype(np.float64) - distributed.theta0[n]) ** 2))
                         for n in distributed.theta0 if distributed.theta0[n].dtype.kind == "f"))
    assert update <= 0.05 + 1e-4  # the mean of clipped updates
    noisy = {"dp_noise_multiplier": 1.0, "dp_clipping_norm": 0.05, "dp_delta": 1e-3}
    strategy, result = federation(clusterfed.FedAvg(secure_aggregation=True, **noisy), rounds=2)
    report = result.clustering["privacy"]
    assert report["epsilon"] > 0 and all(count == 2 for count in strategy.state.dp_releases.values())
    assert largest_difference(strategy.models, distributed.models) > 1e-3  # noise was added


def test_distributed_dp_with_a_coarse_quantization_stops_before_round_1(federation, monkeypatch):
    from clusterfed import StrategyParamsError
    from clusterfed.runner import link

    sent = []
    monkeypatch.setattr(link.Link, "push", lambda self, messages, timeout=None: sent.append(messages) or ([], []))
    with pytest.raises(StrategyParamsError, match="more than a tenth of the clipping norm"):
        federation(clusterfed.FedAvg(secure_aggregation=True, dp_clipping_norm=0.05, secagg_quantization_range=2**12),
                   rounds=1)
    assert not sent
