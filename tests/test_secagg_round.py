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
