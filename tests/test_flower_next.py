"""What Flower 1.43 changes, working on the Flower installed here: ``Strategy.start`` takes
``should_stop(server_round, result)`` (after a round, True ends the run and the Result so far is
returned), and ``Grid.pull_messages``' argument is renamed ``reply_to_message_ids``."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore.task_identity import TaskIdentity
from userapp.client_app import app as stock_client_app
from userapp.task import Net

import clusterfed
from clusterfed.runner.flwr_fedavg import FlowerFedAvg
from clusterfed.report.watch import watch
from clusterfed.runner.inprocess import InProcessGrid

NUM_CLIENTS = 4


def user_grid() -> InProcessGrid:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    return InProcessGrid(stock_client_app, NUM_CLIENTS, node_configs=[{"partition-id": i} for i in range(NUM_CLIENTS)])


class StopAfter:
    """A ``should_stop`` that says stop once round ``last`` is done, and remembers what it was asked."""

    def __init__(self, last: int):
        self.last, self.asked = last, []

    def __call__(self, server_round: int, result: Result) -> bool:
        assert isinstance(result, Result)
        self.asked.append((server_round, sorted(result.train_metrics_clientapp)))
        return server_round >= self.last


@pytest.mark.parametrize("name", ["FedAvg", "CFL"])
def test_should_stop_ends_a_clustered_run_after_the_round_it_says_so(name, caplog, tmp_path):
    strategy = getattr(clusterfed, name)()
    stop = StopAfter(2)
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="flwr"), watch(strategy, tmp_path):
        result = strategy.start(grid=user_grid(), initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=5,
                                train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}), should_stop=stop)
    assert isinstance(result, Result) and isinstance(result, clusterfed.ClusteredResult)
    assert stop.asked == [(1, [1]), (2, [1, 2])]  # after each completed round, with the Result so far
    assert sorted(result.train_metrics_clientapp) == sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert strategy.driver.completed_rounds == 2
    assert len((tmp_path / "rounds.jsonl").read_text().splitlines()) == 2  # two rounds recorded
    assert set(result.arrays) == set(Net().state_dict()) and set(result.assignment) == {
        f"node-{1000 + i}" for i in range(NUM_CLIENTS)}  # the normal exit: models, assignment, clustering
    assert any("[ROUND 2/5] should_stop returned True: the run stops here" in r.getMessage() for r in caplog.records)


def test_should_stop_is_asked_after_every_round_the_last_included():
    """As Flower 1.43's own loop: after each round (not round 0), the last one too."""
    stop = StopAfter(99)
    torch.manual_seed(0)
    result = clusterfed.FedAvg().start(grid=user_grid(), initial_arrays=ArrayRecord(Net().state_dict()),
                                       num_rounds=2, train_config=ConfigRecord({"lr": 0.1}), should_stop=stop)
    assert [r for r, _ in stop.asked] == [1, 2] and sorted(result.train_metrics_clientapp) == [1, 2]


def test_flowers_own_fedavg_honours_should_stop_too(small_config, caplog):
    from clusterfed.client_app import app as builtin_client_app
    from clusterfed.runner.preflight import preflight

    checked = preflight(small_config(strategy="flwr-fedavg", rounds=4, num_clients=NUM_CLIENTS))
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(builtin_client_app, NUM_CLIENTS)
    stop = StopAfter(2)
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = FlowerFedAvg(checked.config).start(grid, checked.initial, num_rounds=4, should_stop=stop)
    assert [r for r, _ in stop.asked] == [1, 2]
    assert sorted(result.train_metrics_clientapp) == sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert set(result.arrays) == set(checked.initial)
    # ours on Flower 1.41/1.42; Flower 1.43's own loop says it in its words
    assert any("[ROUND 2/4] should_stop returned True" in r.getMessage() or "Stopping early after round 2" in r.getMessage()
               for r in caplog.records)


def test_start_takes_the_arguments_of_flowers_start_and_should_stop():
    flower = list(inspect.signature(Grid.pull_messages).parameters)[1:]  # 1.41/1.42: message_ids; 1.43: renamed
    assert flower[0] in ("message_ids", "reply_to_message_ids")  # the first, which our callers pass by position
    ours = inspect.signature(clusterfed.FedAvg.start).parameters
    theirs = inspect.signature(FlowerFedAvg.start).parameters
    for name in ("grid", "initial_arrays", "num_rounds", "timeout", "train_config", "evaluate_config", "evaluate_fn",
                 "should_stop"):
        assert name in ours and name in theirs


@pytest.mark.parametrize("how", ["position", "reply_to_message_ids", "message_ids"])
def test_the_in_process_grid_pulls_by_either_name_of_flowers_argument(how):
    from flwr.app import Message, RecordDict

    grid = user_grid()
    node = list(grid.get_node_ids())[0]
    sent = Message(RecordDict({"config": ConfigRecord({"phase": "profile"})}), dst_node_id=node,
                   message_type="evaluate")
    ids = list(grid.push_messages([sent]))
    replies = list(grid.pull_messages(ids) if how == "position" else grid.pull_messages(**{how: ids}))
    assert [r.metadata.reply_to_message_id for r in replies] == ids
