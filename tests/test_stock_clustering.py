"""One-shot clustering with stock ClientApps written like Flower's quickstart-pytorch: they
train their run config's ``local-epochs`` (1) with SGD momentum and ignore the clustering
step's ``cluster-epochs``; the server chains requests until they have trained as long."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.supercore.task_identity import TaskIdentity
from harness import drive_round, hand, make, trained
from quickstartapp.client_app import app as quickstart_client_app
from quickstartapp.task import Net, group_of
from sklearn.metrics import adjusted_rand_score

import clusterfed
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.strategies import strategy_class
pytestmark = pytest.mark.end_to_end

NUM_CLIENTS = 9  # three label-permutation groups of three
CLUSTER_EPOCHS = 10


def run_quickstart(strategy, rounds: int = 1, server_local_epochs: int = 1):
    """9 stock clients whose run config says local-epochs = 1; the server's train config
    says ``server_local_epochs`` (what it takes a stock client to train per request)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(quickstart_client_app, NUM_CLIENTS,
                         node_configs=[{"partition-id": i} for i in range(NUM_CLIENTS)],
                         run_config={"local-epochs": 1, "batch-size": 32})
    torch.manual_seed(0)
    return strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                          train_config=ConfigRecord({"lr": 0.03, "local-epochs": server_local_epochs}))


def ari(result) -> float:
    keys = sorted(result.assignment)
    groups = [group_of(int(k.removeprefix("node-")) - 1000) for k in keys]
    return adjusted_rand_score(groups, [result.assignment[k] for k in keys])


def model_bytes() -> int:
    return sum(t.numel() * t.element_size() for t in Net().state_dict().values())


def test_fedclust_chains_requests_until_a_quickstart_client_trained_cluster_epochs():
    result = run_quickstart(clusterfed.FedClust(cluster_epochs=CLUSTER_EPOCHS, chain_until="epochs"))
    assert ari(result) >= 0.9, result.clustering.get("one_cluster_reason")
    # every request, chained or not, sends and returns the whole model (a stock client
    # returns it whatever is asked): 10 clustering requests and round 1's training per client
    requests = NUM_CLIENTS * (CLUSTER_EPOCHS + 1)
    assert result.traffic["bytes_up"] == requests * model_bytes()
    assert result.traffic["bytes_down"] == requests * model_bytes()


def test_the_chain_ends_once_the_clustering_is_stable():
    # chain-until = stable (the default): the chain stops when what requests 1..k/2 and
    # k/2+1..k changed cut the clients the same way (k even, at least 2); fewer trainings,
    # the same groups, and the cut taken says which halves agreed
    result = run_quickstart(clusterfed.FedClust(cluster_epochs=CLUSTER_EPOCHS))
    assert ari(result) >= 0.9, result.clustering.get("one_cluster_reason")
    trainings, rest = divmod(result.traffic["bytes_up"], NUM_CLIENTS * model_bytes())
    assert rest == 0 and 2 + 1 <= trainings < CLUSTER_EPOCHS + 1
    assert result.clustering["reproduction"]["source"].startswith("requests 1–")


def test_one_epoch_of_a_quickstart_client_does_not_show_the_groups_in_the_final_layer():
    # the server told that a stock client trains 10 epochs per request sends one request:
    # the clients train 1 epoch, and that is too little to tell the groups apart in the
    # papers' final layer; scored layer by layer, the first hidden layer shows them
    final = run_quickstart(clusterfed.FedClust(cluster_epochs=CLUSTER_EPOCHS, cluster_layers="final"),
                           server_local_epochs=CLUSTER_EPOCHS)
    assert ari(final) < 0.5
    assert final.traffic["bytes_up"] == NUM_CLIENTS * 2 * model_bytes()
    scored = run_quickstart(clusterfed.FedClust(cluster_epochs=CLUSTER_EPOCHS), server_local_epochs=CLUSTER_EPOCHS)
    assert ari(scored) >= 0.9 and scored.clustering["layer_choice"]["chosen"] == "fc1"


@pytest.mark.parametrize("warmup_rounds", [0, 1])
def test_adacfl_without_label_statistics_chains_the_same_way(warmup_rounds):
    result = run_quickstart(clusterfed.AdaCFL(share_label_stats=False, warmup_rounds=warmup_rounds,
                                              cluster_epochs=CLUSTER_EPOCHS),
                            rounds=warmup_rounds + 1)
    assert ari(result) >= 0.9, result.clustering.get("one_cluster_reason")


def test_the_chain_sends_each_stock_client_its_own_reply_and_stops_for_one_that_confirms():
    groups = {str(i): i % 2 for i in range(4)}
    algorithm = make(strategy_class("fedclust"), groups, **{"fedclust.cluster_epochs": 5, "fedclust.chain-until": "epochs",
                                                            "fedclust.cluster-layers": "final"})
    hand(algorithm).train_config["local-epochs"] = 2  # what a stock client trains per request: 3 requests
    for key in ("0", "1", "2"):
        hand(algorithm).clients[key].stock = True
    sent = []

    def respond(ask):  # +1 per request on group 0, -1 on group 1; client 2 confirms the epochs
        sent.append((ask.key, float(ask.model["fc2.bias"][0])))
        out = trained(ask, 1.0 if groups[ask.key] == 0 else -1.0)
        return (out, {"local-epochs": 5}) if ask.key == "2" else out

    batches = drive_round(algorithm, 1, respond)
    first, second, third, _ = batches
    assert [a.key for a in first] == ["0", "1", "2", "3"] and [a.key for a in second] == ["0", "1"] == [
        a.key for a in third]
    # a stock client is asked for its whole model (the next request starts from it); the helper client "3" for the layer
    assert [a.upload for a in first] == [None, None, None, ["fc2.weight", "fc2.bias"]]
    assert [bias for key, bias in sent if key == "0"][:3] == [0.0, 1.0, 2.0]  # its own replies, sent back
    rows = dict(zip(algorithm.state.clustering_state["client_order"], algorithm.state.clustering_state["labels"]))
    assert rows["0"] == rows["2"] != rows["1"] == rows["3"]
    assert batches.diagnostics["stock_chained_requests"] == 4
