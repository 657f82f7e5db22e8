"""Every public strategy through Flower's single-phase hooks (``configure_train`` /
``aggregate_train`` / ``configure_evaluate`` / ``aggregate_evaluate``), as Flower's own
``Strategy.start`` loop or a user's would call them: each either trains every round or
refuses with one ``StrategyParamsError`` / ``CapabilityError`` that names ``strategy.start``
or the client helper, never a bare ``KeyError``."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from flwr.supercore.task_identity import TaskIdentity
from userapp.client_app import app as stock_client_app
from userapp.task import Net, load_data

import clusterfed
from clusterfed import protocol
from clusterfed.client import ClientTask, TaskData, client_app
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.strategies import public_strategies

NUM_CLIENTS = 4
ROUNDS = 3
HELPER_APP = client_app(ClientTask(
    model_fn=lambda context, config: Net(),
    data_fn=lambda context, config: TaskData(*load_data(context.node_config["partition-id"]),
                                             labels=np.array([0, 1]))))
# what each strategy does through the hooks, helper clients, defaults (IFCA needs helper
# clients; a strategy whose round first asks clients for clustering work needs start())
REFUSES = {"FedClust": "round 1 first asks 4 client(s) for cluster work",
           "AdaCFL": "round 2 first asks 4 client(s) for cluster work"}


class CountingGrid(InProcessGrid):
    """The in-process grid, counting the train messages pushed to it."""

    trains = 0

    def push_messages(self, messages):
        messages = list(messages)
        self.trains += sum(m.metadata.message_type == MessageType.TRAIN for m in messages)
        return super().push_messages(messages)

def new_grid(app) -> CountingGrid:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    return CountingGrid(app, NUM_CLIENTS, node_configs=[{"partition-id": i} for i in range(NUM_CLIENTS)])


def initial_arrays() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(Net().state_dict())


def flowers_loop(strategy, app, rounds: int = ROUNDS, grid: CountingGrid | None = None) -> list[tuple]:
    """What Flower's ``Strategy.start`` does each round with the hooks; each round's
    aggregated train and evaluate metrics."""
    grid = grid or new_grid(app)
    strategy.init(protocol.from_array_record(initial_arrays()))
    arrays, metrics = ArrayRecord(), []
    for server_round in range(1, rounds + 1):
        config = ConfigRecord({"lr": 0.1, "local-epochs": 1})
        messages = strategy.configure_train(server_round, arrays, config, grid)
        arrays, trained = strategy.aggregate_train(server_round, grid.send_and_receive(messages))
        evaluated = strategy.aggregate_evaluate(server_round, grid.send_and_receive(
            strategy.configure_evaluate(server_round, arrays, ConfigRecord({}), grid)))
        metrics.append((trained, evaluated))
    return metrics


@pytest.mark.parametrize("name", sorted(public_strategies()))
def test_every_public_strategy_trains_through_the_single_phase_hooks_or_refuses_clearly(name):
    strategy = getattr(clusterfed, name)()
    if name in REFUSES:
        grid = new_grid(HELPER_APP)
        with pytest.raises(clusterfed.StrategyParamsError,
                           match=rf"^{strategy.name}: {re.escape(REFUSES[name])} .*nothing was sent.*strategy\.start\("):
            flowers_loop(strategy, HELPER_APP, grid=grid)
        refused_round = int(REFUSES[name].split()[1])
        assert grid.trains == NUM_CLIENTS * (refused_round - 1)  # the refused round sent nothing
        return
    metrics = flowers_loop(strategy, HELPER_APP)
    for trained, evaluated in metrics:
        assert trained["num-examples"] > 0 and evaluated["num-examples"] > 0
    assert set(strategy.assignment) == {str(i) for i in range(NUM_CLIENTS)}  # the helper keys partitions


def test_ifca_through_the_hooks_lets_each_client_choose_among_the_k_models():
    strategy = clusterfed.IFCA(num_clusters=2)
    flowers_loop(strategy, HELPER_APP)
    assert set(strategy.assignment.values()) <= {0, 1} and len(strategy.assignment) == NUM_CLIENTS
    assert strategy.driver.link.traffic.faults == {}  # every reply accepted, none a mismatch


def test_ifca_through_the_hooks_refuses_stock_clients_before_any_train_message():
    with pytest.raises(clusterfed.CapabilityError, match="choosing the lowest-training-loss model"):
        flowers_loop(clusterfed.IFCA(num_clusters=2), stock_client_app)


def test_ifca_restarts_need_start_and_say_so_through_the_hooks():
    with pytest.raises(clusterfed.StrategyParamsError, match=r"^ifca: round 1 asks 4 client\(s\) for a second exchange.*strategy\.start\("):
        flowers_loop(clusterfed.IFCA(num_clusters=2, restarts=2), HELPER_APP, rounds=1)


@pytest.mark.parametrize("name", ["FedAvg", "CFL", "IFCA"])
def test_the_hooks_run_the_same_round_as_start(name):
    """One round, written once: Flower's loop through the hooks ends with the cluster models
    and assignment that ``start`` ends with, on the same clients."""
    through_hooks = getattr(clusterfed, name)()
    flowers_loop(through_hooks, HELPER_APP)
    started = getattr(clusterfed, name)()
    started.start(grid=new_grid(HELPER_APP), initial_arrays=initial_arrays(), num_rounds=ROUNDS,
                  train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}))
    assert through_hooks.assignment == started.assignment
    hooks_models, start_models = through_hooks.cluster_models(), started.cluster_models()
    assert sorted(hooks_models) == sorted(start_models)
    for cluster, model in start_models.items():
        for array, value in model.items():
            np.testing.assert_array_equal(hooks_models[cluster][array], value, err_msg=f"{cluster} {array}")


@pytest.mark.parametrize("name", sorted(public_strategies()))
def test_every_public_strategy_has_what_the_driver_calls(name):
    """The driver reads and calls ``strategy_protocol.DRIVER_CALLS`` on a strategy, not the
    strategies' base: each public strategy has every one of them."""
    from clusterfed.strategy_protocol import DRIVER_CALLS

    strategy = getattr(clusterfed, name)()
    strategy.init(protocol.from_array_record(initial_arrays()))
    assert {n for n in DRIVER_CALLS if not hasattr(strategy, n)} == set()
