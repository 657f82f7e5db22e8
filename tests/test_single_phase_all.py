"""Every public strategy through Flower's single-phase hooks (``configure_train`` /
``aggregate_train`` / ``configure_evaluate`` / ``aggregate_evaluate``), as Flower's own
``Strategy.start`` loop or a user's would call them: each either trains every round or
refuses with one ``StrategyParamsError`` / ``CapabilityError`` that names ``strategy.start``
or the client helper, never a bare ``KeyError``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
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
# clients; a strategy that places clients by a clustering exchange needs start()'s phases)
REFUSES = {"FedClust": "placement step", "AdaCFL": "before-train step"}

def flowers_loop(strategy, app, rounds: int = ROUNDS) -> list[tuple]:
    """What Flower's ``Strategy.start`` does each round with the hooks; each round's
    aggregated train and evaluate metrics."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(app, NUM_CLIENTS, node_configs=[{"partition-id": i} for i in range(NUM_CLIENTS)])
    torch.manual_seed(0)
    strategy.init(protocol.from_array_record(ArrayRecord(Net().state_dict())))
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
        with pytest.raises(clusterfed.StrategyParamsError, match=rf"{REFUSES[name]} .*strategy\.start\(") as error:
            flowers_loop(strategy, HELPER_APP)
        assert "KeyError" not in str(error.value)
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
