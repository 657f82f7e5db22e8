"""Membership that waits for cold starts and hides no one, with a stock Flower ClientApp.

- The run's first profile probe waits ``probe-timeout`` (at least the round ``timeout``): a
  node whose ClientApp answers its first message late (a cold start) takes part from round
  1. The delay waits on the in-process grid's virtual clock: the test takes no time, and it
  asserts outcomes, never durations.
- A client that fails gets one WARNING naming it with its error's full text (a state_dict
  shape mismatch keeps its keys and shapes), stays in ``result.assignment`` (its last
  cluster, or ``UNASSIGNED``), and the round line says over how many clients it evaluated.
"""

from __future__ import annotations

import logging

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity
from torch import nn
from userapp.client_app import train_fn
from userapp.task import Net, load_data
from userapp.task import test as evaluate_net

import clusterfed
from clusterfed import faults
from clusterfed.config import ConfigError, parse_config
from clusterfed.runner.driver import RunOptions
from clusterfed.runner.membership import UNASSIGNED
from clusterfed.runner.inprocess import InProcessGrid

NUM_CLIENTS = 4
TIMEOUT = 20.0  # the round timeout of every run here, in virtual seconds
COLD_START = 45.0  # what a slow node's first reply takes


class NarrowNet(Net):
    """Another model than the server's: its output layer has 3 classes, not 2."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 3)


def stock_app(*, cold: set[int] = frozenset(), raises: set[int] = frozenset(), narrow: set[int] = frozenset(),
              slow_train: set[int] = frozenset(), name_in: str = "metrics",
              raises_evidence: set[int] = frozenset()) -> ClientApp:
    """The user app's stock ClientApp, evaluating as Flower's quickstart does and naming its
    partition (``partition-id``) in its ``metrics`` or a ``config`` record; partitions in
    ``cold`` answer their first message ``COLD_START`` seconds late, those in ``raises`` raise
    a two-line error in train, those in ``slow_train`` train ``COLD_START`` seconds from round
    2 on, those in ``narrow`` hold ``NarrowNet``, those in ``raises_evidence`` raise when asked
    for evidence only (``evidence-ask`` in the config)."""
    app, seen = ClientApp(), set()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        partition = context.node_config["partition-id"]
        if partition in raises:
            raise ValueError(f"sensor {partition} offline\ncalibration file /data/{partition}.cal is missing")
        if partition in raises_evidence and msg.content["config"].get("evidence-ask"):
            raise ValueError(f"sensor {partition} offline for its second training")
        if partition in slow_train and msg.content["config"]["server-round"] > 1:
            faults.clock.sleep(COLD_START)
        return train_fn(msg, context)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        partition = context.node_config["partition-id"]
        if partition in cold and partition not in seen:
            faults.clock.sleep(COLD_START)  # importing torch, loading data
        seen.add(partition)
        net = NarrowNet() if partition in narrow else Net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        loss, accuracy = evaluate_net(net, load_data(partition)[1])
        metrics = {"eval_loss": loss, "eval_acc": accuracy, "num-examples": 24}
        if name_in == "metrics":
            return Message(RecordDict({"metrics": MetricRecord({**metrics, "partition-id": partition})}), reply_to=msg)
        return Message(RecordDict({"metrics": MetricRecord(metrics), "config": ConfigRecord({"partition-id": partition})}),
                       reply_to=msg)

    return app


class FedAvgAskingForEvidence(clusterfed.FedAvg):
    """FedAvg that, as FedClust's merge probe does, asks its trainers a second time in each
    round for evidence only (``evidence-ask`` in the config), and averages their first replies."""

    def train(self, rnd, trainers):
        replies, diagnostics = yield from super().train(rnd, trainers)
        rnd.evidence_replies = list((yield self.train_asks(rnd, trainers, extra={"evidence-ask": True}, evidence=True)))
        return replies, diagnostics


def run(strategy, app: ClientApp, rounds: int = 2, **options):
    """A user's ServerApp: ``strategy.start`` with a round ``timeout`` of ``TIMEOUT`` s on a
    grid whose clients' time runs on a virtual clock."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(app, NUM_CLIENTS, timeout=TIMEOUT,
                         node_configs=[{"partition-id": i} for i in range(NUM_CLIENTS)])
    if options:
        strategy.run_options = RunOptions(**options)
    torch.manual_seed(0)
    return strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                          timeout=TIMEOUT, train_config=ConfigRecord({"lr": 0.1}))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def round_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("[ROUND")]


def test_a_node_answering_its_first_probe_after_timeout_but_within_probe_timeout_trains_from_round_1(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(clusterfed.FedAvg(), stock_app(cold={2}))
    assert result.assignment == {str(i): 0 for i in range(NUM_CLIENTS)}
    assert result.train_metrics_clientapp[1]["num-examples"] == NUM_CLIENTS * 72  # all four trained in round 1
    assert not warnings_of(caplog)


def test_with_probe_timeout_no_longer_than_timeout_the_cold_node_misses_round_1_named_and_joins_round_2(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(clusterfed.FedAvg(), stock_app(cold={2}), probe_timeout=TIMEOUT)
    assert result.train_metrics_clientapp[1]["num-examples"] == 3 * 72
    assert result.train_metrics_clientapp[2]["num-examples"] == NUM_CLIENTS * 72  # probed again: it joins
    assert warnings_of(caplog) == [f"round 1: node 1002 in profile probe: no reply within {TIMEOUT:g} s"]
    assert set(result.assignment) == {str(i) for i in range(NUM_CLIENTS)}


def test_a_run_whose_every_node_starts_cold_waits_for_them_or_says_which_node_did_not_answer():
    result = run(clusterfed.FedAvg(), stock_app(cold=set(range(NUM_CLIENTS))), rounds=1)
    assert len(result.assignment) == NUM_CLIENTS
    with pytest.raises(clusterfed.ClientFailureError, match=r"no client could be profiled; the first error: "
                                                            r"node 1000: no reply within 30 s"):
        run(clusterfed.FedAvg(), stock_app(cold=set(range(NUM_CLIENTS))), rounds=1, probe_timeout=30.0)


def test_probe_timeout_is_a_run_config_key():
    assert parse_config({"probe-timeout": 300}).probe_timeout == 300.0
    with pytest.raises(ConfigError, match="probe-timeout"):
        parse_config({"probe-timeout": 0})


def test_a_raising_client_is_warned_about_in_full_kept_in_the_assignment_and_counted_in_the_accuracy(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(clusterfed.FedClust(), stock_app(raises={2}), rounds=2)
    failures = [m for m in warnings_of(caplog) if "failed in train" in m]
    # one WARNING per failed train message (round 1: the clustering step and round 1's
    # training; round 2: placing it), each naming the client and quoting both lines
    assert failures and all(m.startswith(f"round {m[6]}: client 2 (node 1002) failed in train: ValueError: "
                                         "sensor 2 offline\ncalibration file /data/2.cal is missing")
                            for m in failures)
    assert result.assignment["2"] == UNASSIGNED  # never placed: it never trained
    assert {k: v for k, v in result.assignment.items() if k != "2"} and UNASSIGNED not in [
        v for k, v in result.assignment.items() if k != "2"]
    assert all("evaluate over 3 of 4 clients: " in line for line in round_lines(caplog))


def test_a_client_that_fails_after_it_was_placed_keeps_its_cluster():
    result = run(clusterfed.FedAvg(), stock_app(raises={1}), rounds=2)
    assert result.assignment == {str(i): 0 for i in range(NUM_CLIENTS)}
    assert result.train_metrics_clientapp[2]["num-examples"] == 3 * 72


def test_a_client_timing_out_in_train_is_named_in_a_warning_and_keeps_its_cluster(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(clusterfed.FedAvg(), stock_app(slow_train={1}), rounds=2)
    assert warnings_of(caplog) == [f"round 2: client 1 (node 1001) in train: no reply within {TIMEOUT:g} s"]
    assert result.assignment == {str(i): 0 for i in range(NUM_CLIENTS)}
    assert "1 client(s) failed" in round_lines(caplog)[1]


def test_a_model_shape_mismatch_is_quoted_with_every_key_and_shape_and_the_node_stays_in_the_result(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(clusterfed.FedAvg(), stock_app(narrow={3}), rounds=1)
    (warning,) = [m for m in warnings_of(caplog) if "node 1003" in m]
    assert warning.startswith("round 1: node 1003 failed in profile probe: RuntimeError: Error(s) in loading "
                              "state_dict for NarrowNet:\n")
    assert "size mismatch for out.weight: copying a param with shape torch.Size([2, 16])" in warning
    assert "size mismatch for out.bias" in warning and "torch.Size([3])" in warning
    assert result.assignment == {"0": 0, "1": 0, "2": 0, "node-1003": UNASSIGNED}
    assert "evaluate over 3 of 4 clients: " in round_lines(caplog)[0]


def test_a_stock_client_naming_its_partition_in_a_config_record_is_keyed_by_it():
    result = run(clusterfed.FedAvg(), stock_app(name_in="config"), rounds=1)
    assert sorted(result.assignment) == [str(i) for i in range(NUM_CLIENTS)]


def test_the_run_summary_says_over_how_many_of_how_many_clients_the_final_accuracy_was_taken():
    from clusterfed.results import summarize, summary_table

    last = {"round": 1, "accuracy": 0.8, "accuracy_std": 0.1, "ari": 1.0, "num_clusters": 2, "cum_bytes_down": 0,
            "cum_bytes_up": 0, "clients_evaluated": 3, "clients_known": 3, "clients_absent": 1}
    summary = summarize([last], target=0.9)
    assert (summary["final_clients_evaluated"], summary["final_clients_known"]) == (3, 4)
    assert "final acc over 3 of 4 clients" in summary_table([{**summary, "strategy": "fedclust"}])
    everyone = summarize([{**last, "clients_absent": 0}], target=0.9)
    assert " over " not in summary_table([{**everyone, "strategy": "fedclust"}])


def test_an_error_reply_is_quoted_in_full_out_of_flowers_wrapper_and_cut_only_when_very_long():
    from clusterfed.runner.replies import FULL_REASON_CHARS, first_line, full_text

    flower = ("<class 'RuntimeError'>:<'[client-key \"3\"] Error(s) in loading state_dict for Net:\n"
              "\tsize mismatch for out.weight: copying a param with shape torch.Size([2, 16]) from checkpoint, "
              "the shape in current model is torch.Size([3, 16]).\n\n'>")
    assert full_text(flower) == ("RuntimeError: Error(s) in loading state_dict for Net:\n\tsize mismatch for "
                                 "out.weight: copying a param with shape torch.Size([2, 16]) from checkpoint, the "
                                 "shape in current model is torch.Size([3, 16]).")
    assert first_line(flower) == "RuntimeError: Error(s) in loading state_dict for Net:"
    long = full_text("x" * (FULL_REASON_CHARS + 10))
    assert long.startswith("x" * FULL_REASON_CHARS) and long.endswith("… (10 more characters)")


def test_a_client_failing_only_an_ask_for_evidence_did_its_round_and_its_metrics_count_once(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(FedAvgAskingForEvidence(), stock_app(raises_evidence={1}))
    for rnd in (1, 2):  # each client's averaged training, once: not its evidence training too
        assert result.train_metrics_clientapp[rnd]["num-examples"] == NUM_CLIENTS * 72
    for line in round_lines(caplog):
        assert "train: 7 of 8 replies accepted from 4 clients (some asked more than once); 1 cluster;" in line
        assert "failed" not in line  # it trained and was averaged: it did its round
    warnings = warnings_of(caplog)
    assert len(warnings) == 2 and all("in train (asked for evidence only)" in w and "offline for its second" in w
                                      for w in warnings)


def test_a_client_failing_its_averaged_training_fails_the_round_though_asked_again_for_evidence(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    result = run(FedAvgAskingForEvidence(), stock_app(raises={1}))
    assert result.train_metrics_clientapp[1]["num-examples"] == 3 * 72
    assert all("train: 6 of 8 replies accepted from 4 clients (some asked more than once), 1 client(s) failed" in line
               for line in round_lines(caplog))


def test_an_ask_for_evidence_fails_only_a_client_none_of_whose_trainings_the_round_averaged():
    from clusterfed.runner.link import Link

    link = Link({"a": 1, "b": 2}, {1: "a", 2: "b"})
    for key, node in (("a", 1), ("b", 2)):  # a trained and was averaged; b was asked for evidence only
        link.fail(3, "timeout", "no reply within 20 s", key, node, evidence=True)
    link.settle(trained={"a"})
    assert link.failed_keys == {"b"} and len(link.traffic.failed) == 2
