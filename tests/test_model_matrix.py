"""The model matrix's fast cells: users' own models and stock ClientApps (not clusterfed's)
under clusterfed's strategies, through the users' own ServerApp. Each cell recovers the
groups (ARI ≥ 0.9) and beats FedAvg on the same federation by a clear margin, or stops with
its true reason; arrays of every dtype and shape (0-d buffers, int64 counters, float16)
come back as they were sent. The full matrix: benchmarks/model_matrix.py (make bench-models)."""

from __future__ import annotations

import logging
from functools import lru_cache

import numpy as np
import pytest
import torch
from model_matrix.cells import MIN_ARI, MIN_GAIN, run_cell, verdict
from model_matrix.data import NUM_GROUPS, make_examples
from model_matrix.models import build_model, half_supported
from model_matrix import server_app
from model_matrix.server_app import initial_model

from clusterfed import FedClust

NUM_CLIENTS = 9  # three per group: the small federation a user tries first


@pytest.fixture(autouse=True)
def one_thread_quiet_flower():
    threads, level = torch.get_num_threads(), logging.getLogger("flwr").level
    torch.set_num_threads(1)  # tiny models on shared cores
    logging.getLogger("flwr").setLevel(logging.ERROR)
    yield
    torch.set_num_threads(threads)
    logging.getLogger("flwr").setLevel(level)


@lru_cache(maxsize=None)
def fedavg_accuracy(model: str, shift: str, rounds: int) -> float:
    cell, _ = run_cell(model, shift, "fedavg", rounds=rounds, num_clients=NUM_CLIENTS)
    return cell.accuracy


@pytest.mark.parametrize("model, shift, strategy, rounds", [
    ("resnet-bn", "concept", "cfl", 10),         # BatchNorm buffers and counters beside the weights
    ("gru", "concept", "fedclust", 8),           # GRU weights (weight_ih_l0, ...), an embedding
    ("transformer", "concept", "hicfl", 20),     # in_proj_weight, LayerNorm, a position table
])
def test_a_users_model_and_stock_client_app_get_their_groups_and_beat_fedavg(model, shift, strategy, rounds):
    cell, _ = run_cell(model, shift, strategy, rounds=rounds, num_clients=NUM_CLIENTS)
    fedavg = fedavg_accuracy(model, shift, rounds)
    assert cell.ari is not None and cell.ari >= MIN_ARI, (cell.clusters, cell.reason)
    assert cell.accuracy >= fedavg + MIN_GAIN, (cell.accuracy, fedavg)
    assert verdict(cell, fedavg) == "holds"


def test_the_quickstart_client_is_clustered_right_once_the_clustering_step_trains_long_enough(monkeypatch):
    """The quickstart client trains the epochs of its run config, whatever the message says;
    FedClust sends it its own reply back until it has trained ``cluster-epochs``. From scratch
    on 64 examples, the default 10 leave its final layer's changes too noisy for the cut (the
    matrix's quickstart rows); 30 recover the groups."""
    monkeypatch.setitem(server_app.STRATEGIES, "fedclust", lambda k: FedClust(fraction_train=1.0, cluster_epochs=30,
                                                                                 chain_until="epochs"))
    cell, result = run_cell("quickstart", "concept", "fedclust", rounds=8, num_clients=NUM_CLIENTS)
    assert cell.ari is not None and cell.ari >= MIN_ARI, (cell.clusters, cell.reason)
    assert cell.accuracy >= fedavg_accuracy("quickstart", "concept", 8) + MIN_GAIN
    model_bytes = sum(array.numpy().nbytes for array in result.arrays.values())
    # the clustering step: the first request and 29 chained ones, the whole model each way
    assert result.traffic["bytes_up"] >= NUM_CLIENTS * 30 * model_bytes


def test_the_quickstart_client_under_ifca_is_refused_for_the_capability_it_lacks():
    cell, result = run_cell("quickstart", "concept", "ifca", rounds=2, num_clients=NUM_CLIENTS)
    assert result is None and "lowest-training-loss" in cell.reason and "clusterfed.client" in cell.reason
    assert verdict(cell, 0.1) == "refused: needs the client helper"


ROUND_TRIP_MODELS = ["scalar-buffer", "resnet-bn"] + (["float16"] if half_supported() else [])


@pytest.mark.parametrize("strategy", ["fedavg", "fedclust", "cfl"])
@pytest.mark.parametrize("model", ROUND_TRIP_MODELS)
def test_a_client_returning_what_it_received_gets_every_array_back_unchanged(model, strategy):
    """0-d buffers stay shape (), int64 counters int64, float16 float16: in every reply the
    server accepts and in the models it returns."""
    cell, result = run_cell(model, "concept", strategy, rounds=3, num_clients=NUM_GROUPS * 2, client="echo")
    assert result is not None and not (result.clustering or {}).get("training_failed"), cell.reason
    torch.manual_seed(0)
    sent = {name: tensor.numpy() for name, tensor in initial_model(model).state_dict().items()}
    for arrays in [result.arrays, *result.cluster_arrays.values()]:
        back = {name: array.numpy() for name, array in arrays.items()}
        assert list(back) == list(sent)
        for name, array in sent.items():
            assert (back[name].dtype, back[name].shape) == (array.dtype, array.shape), name
            assert np.array_equal(back[name], array), name


def test_the_client_helper_trains_a_batchnorm_model_sent_by_ifca():
    """num_batches_tracked (a 0-d int64 buffer) reaches the helper's model in its own shape."""
    cell, result = run_cell("resnet-bn", "concept", "ifca", rounds=2, num_clients=NUM_CLIENTS)
    assert result is not None and not (result.clustering or {}).get("training_failed"), cell.reason
    assert cell.accuracy is not None and len(cell.assignment) == NUM_CLIENTS


def test_the_generated_groups_disagree_where_they_should():
    """Concept shift: the same inputs, labels permuted per group; covariate shift: the same
    labels, inputs transformed per group (group 0 untouched in both)."""
    x0, y0 = make_examples("vector", "concept", 0, 32)
    assert x0.shape == (32, 16) and set(np.unique(y0)) <= set(range(4))
    for kind in ("vector", "image", "tokens"):
        concept = [make_examples(kind, "concept", p, 64) for p in range(NUM_GROUPS)]
        covariate = [make_examples(kind, "covariate", p, 64) for p in range(NUM_GROUPS)]
        assert np.array_equal(covariate[0][0], concept[0][0]) and np.array_equal(covariate[0][1], concept[0][1])
        for group in (1, 2):
            # the same draw of classes: concept relabels, covariate transforms the inputs
            assert np.array_equal(concept[group][1], (covariate[group][1] + group) % 4)
            assert not np.array_equal(covariate[group][0], concept[group][0])
    assert build_model("transformer")(torch.from_numpy(make_examples("tokens", "concept", 1, 5)[0])).shape == (5, 4)
