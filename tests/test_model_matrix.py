"""The model matrix's fast cells: users' own models and stock ClientApps (not clusterfed's)
under clusterfed's strategies, through the users' own ServerApp. Each cell recovers the
groups (ARI ≥ 0.9) and beats FedAvg on the same federation by a clear margin, or stops with
its true reason; arrays of every dtype and shape (0-d buffers, int64 counters, float16)
come back as they were sent; each model written as outside users write them (MobileNetV2-style,
a frozen backbone, a head before an auxiliary decoder, an LSTM, the quickstart client at lr 0.1)
trains through its stock ClientApp. The full matrix: benchmarks/model_matrix.py (make
bench-models)."""

from __future__ import annotations

import logging
from functools import lru_cache

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from model_matrix.cells import APPS, LEARNING_RATES, MIN_ARI, MIN_GAIN, client_for, run_cell, run_config, verdict
from model_matrix.data import NUM_GROUPS, make_examples
from model_matrix.models import build_model, half_supported
from model_matrix import server_app
from model_matrix.server_app import initial_model

from clusterfed import FedClust
pytestmark = pytest.mark.end_to_end

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


USER_MODELS = ["mobilenet", "frozen-backbone", "head-not-last", "lstm", "quickstart-lr0.1"]


def train_through_the_stock_client(model: str) -> tuple[dict, Message]:
    """One train message to the model's stock ClientApp (partition 1, concept shift): the
    arrays sent and the reply."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 7, 1
    torch.manual_seed(0)
    sent = initial_model(model).state_dict()
    content = RecordDict({"arrays": ArrayRecord(sent),
                          "config": ConfigRecord({"lr": LEARNING_RATES[model], "server-round": 1})})
    message = Message(content, dst_node_id=7, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = "m1"
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 3}, state=RecordDict(),
                      run_config=run_config(model, "concept", "fedavg", 1, 3))
    return {name: tensor.numpy() for name, tensor in sent.items()}, APPS[client_for(model, "fedavg")](message, context)


@pytest.mark.parametrize("model", USER_MODELS)
def test_a_users_model_trains_through_its_stock_client_and_only_its_trainable_arrays_change(model):
    """The reply carries the whole state_dict in the shapes and dtypes sent; every array
    with requires_grad moved, a frozen one (the "pretrained" backbone) is returned bit for
    bit; BatchNorm counted the local steps."""
    sent, reply = train_through_the_stock_client(model)
    back = {name: array.numpy() for name, array in reply.content["arrays"].items()}
    assert list(back) == list(sent)
    assert np.isfinite(reply.content["metrics"]["train_loss"]) and reply.content["metrics"]["num-examples"] == 64
    trainable = {name: p.requires_grad for name, p in initial_model(model).named_parameters()}
    for name, array in sent.items():
        assert (back[name].dtype, back[name].shape) == (array.dtype, array.shape), name
        if name in trainable:
            assert np.array_equal(back[name], array) != trainable[name], name
        elif name.endswith("num_batches_tracked"):
            assert int(back[name]) == int(array) + 4, name  # 64 examples in batches of 16
    if model == "frozen-backbone":
        assert [name for name, moves in trainable.items() if not moves] == [
            "backbone.0.weight", "backbone.0.bias", "backbone.2.weight", "backbone.2.bias"]
    if model == "head-not-last":  # the auxiliary loss trains the decoder that follows the head
        assert [name for name in back if name.endswith("weight") and back[name].ndim == 2][-1] == "aux.weight"


def test_the_frozen_backbone_comes_back_unchanged_from_a_clustered_run():
    cell, result = run_cell("frozen-backbone", "concept", "cfl", rounds=3, num_clients=NUM_CLIENTS)
    assert result is not None and cell.accuracy is not None, cell.reason
    torch.manual_seed(0)
    sent = initial_model("frozen-backbone").state_dict()
    for arrays in [result.arrays, *result.cluster_arrays.values()]:
        for name in ("backbone.0.weight", "backbone.0.bias", "backbone.2.weight", "backbone.2.bias"):
            assert np.array_equal(arrays[name].numpy(), sent[name].numpy()), name
        assert not np.array_equal(arrays["head.weight"].numpy(), sent["head.weight"].numpy())


def test_the_lstm_learns_the_tokens_under_fedavg():
    """Vocabulary permuted per group, labels shared: one model can learn every group, so
    FedAvg's accuracy is far above chance (1/4)."""
    cell, _ = run_cell("lstm", "covariate", "fedavg", rounds=10, num_clients=NUM_CLIENTS)
    assert cell.accuracy >= 0.45, cell.accuracy_by_round
    assert (cell.trainings, cell.peak_trainings) == (10, 1)  # FedAvg: one training a client a round
