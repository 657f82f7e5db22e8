"""The paper presets of the one-shot strategies (``FedClust.PAPER``, ``AdaCFL.PAPER``) run the
published rules, checked on hand-made partial weights whose right clustering is computed by
hand below (driven without Flower, replies fed as arrays).

The changes a client uploads are points in the first coordinates of the compared layer (every
other coordinate unchanged), so the L2 distances between clients are plain plane geometry."""

from __future__ import annotations

import numpy as np
from harness import drive_round, hand, theta0, trained

from clusterfed.strategies.adacfl import AdaCFL
from clusterfed.core.exchange import ClientInfo
from clusterfed.strategies.fedclust import FedClust


def build(cls, params: dict, keys: list[str], *, stats=None, examples: int = 50, local_epochs: int = 1):
    """``cls(**params)`` started from the harness model, knowing ``keys`` (all active)."""
    algorithm = cls(**params)
    hand(algorithm).train_config = {"lr": 0.05, "local-epochs": local_epochs}
    algorithm.init(theta0(), hand(algorithm).train_config)
    for key in keys:
        hand(algorithm).clients[key] = ClientInfo(key, examples, 0, dict((stats or {}).get(key, {})))
    hand(algorithm).active = list(keys)
    return algorithm


def responder(points: dict[str, tuple[float, float]], layer: str, decoy: str = "conv1.weight"):
    """A client's reply: in the clustering phase, its ``points`` entry added to the first two
    coordinates of ``layer``'s weight, and a decoy change in another layer that groups the
    clients otherwise (even keys +5, odd keys -5): only a rule that compares ``layer`` alone
    sees the points' groups. Training rounds change nothing."""
    def respond(ask):
        if ask.config["phase"] != "cluster":
            return trained(ask, 0.0)
        out = {}
        for name in ask.upload or list(ask.model):
            array = ask.model[name].copy()
            if name == f"{layer}.weight":
                array.flat[:2] += np.asarray(points[ask.key], dtype=np.float32)
            if name == decoy:
                array.flat[0] += np.float32(5.0 if int(ask.key) % 2 == 0 else -5.0)
            out[name] = array
        return out
    return respond


def clusters_of(algorithm, keys) -> list[set[str]]:
    groups: dict[int, set[str]] = {}
    for key in keys:
        groups.setdefault(algorithm.assignment[key], set()).add(key)
    return sorted(groups.values(), key=min)


# -------------------------------------------------------------------------------- FedClust
def test_fedclust_preset_switches_every_extension_off():
    p = FedClust(**FedClust.PAPER).params
    assert (p.cluster_layers, p.distance, p.recut, p.chain_until, p.cluster_sample, p.cluster_epochs) == \
        ("final", "l2", False, "epochs", 0, 10)
    # λ is the paper's input (Alg. 1) with no published value: the preset leaves it to the caller
    assert "lambda_" not in FedClust.PAPER


def test_fedclust_preset_cuts_the_final_layer_at_lambda_by_l2_and_places_newcomers_at_the_nearest():
    """Final-layer changes along one axis: clients 0, 1 at 1.0, 1.1 and clients 2, 3 at 3.0,
    3.1. L2: 0.1 inside each pair, 1.9 to 2.1 (average 2.0) between them, so HC(M, λ = 1)
    keeps the two pairs apart. The points are parallel (cosine distance 0), so the default's
    cosine distance sees one group; the decoy layer groups {0, 2} / {1, 3}. Newcomers 4 at
    2.8 (0.25 from the pair {2, 3}'s reference 3.05, 1.75 from {0, 1}'s 1.05) and 5 at 10
    (nearest to 3.05 too): both join {2, 3}'s cluster, FedClust never founds one (Alg. 2)."""
    points = {"0": (1.0, 0.0), "1": (1.1, 0.0), "2": (3.0, 0.0), "3": (3.1, 0.0), "4": (2.8, 0.0), "5": (10.0, 0.0)}
    keys = list(points)
    algorithm = build(FedClust, {**FedClust.PAPER, "lambda_": 1.0}, keys)
    hand(algorithm).active = keys[:4]
    respond = responder(points, "fc2")
    (cluster_asks, _) = drive_round(algorithm, 1, respond)
    assert all(ask.upload == ["fc2.weight", "fc2.bias"] for ask in cluster_asks)  # the final layer only
    assert clusters_of(algorithm, keys[:4]) == [{"0", "1"}, {"2", "3"}]
    assert algorithm.state.clustering_state["lambda"] == 1.0
    assert np.isclose(algorithm.state.clustering_state["distance_matrix"][0][2], 2.0)
    assert set(algorithm.models) == set(algorithm.assignment.values())
    assert all(all(np.all(m[name] == 0) for name in m) for m in algorithm.models.values())  # every model at θ0
    hand(algorithm).active = keys
    drive_round(algorithm, 2, respond)
    assert clusters_of(algorithm, keys) == [{"0", "1"}, {"2", "3", "4", "5"}]
    assert [entry["new_cluster"] for entry in algorithm.state.newcomer_log] == [False, False]
    assert np.isclose(algorithm.state.newcomer_log[0]["distance"], 0.25, atol=1e-6)

    # the defaults: cosine distance on parallel changes finds no group in the final layer's points
    default = build(FedClust, {"lambda_": 1.0, "cluster_layers": "final"}, keys[:4])
    drive_round(default, 1, respond)
    assert clusters_of(default, keys[:4]) == [{"0", "1", "2", "3"}]


def test_fedclust_preset_trains_a_stock_client_the_papers_epochs():
    """A stock ClientApp trains its own local-epochs (2) per request: under the preset it is
    sent its reply back until it has trained cluster-epochs = 10, 5 requests, however early
    the cut settles (``chain-until = epochs``)."""
    points = {"0": (1.0, 0.0), "1": (1.1, 0.0), "2": (3.0, 0.0), "3": (3.1, 0.0)}
    algorithm = build(FedClust, {**FedClust.PAPER, "lambda_": 1.0}, list(points), local_epochs=2)
    hand(algorithm).clients["0"].stock = True
    respond = responder(points, "fc2")

    def stock_first(ask):  # client 0 moves 0.2 per request of 2 epochs, and returns its whole model
        if ask.key != "0" or ask.config["phase"] != "cluster":
            return respond(ask)
        out = {name: array.copy() for name, array in ask.model.items()}
        out["fc2.weight"].flat[0] += np.float32(0.2)
        return out

    batches = drive_round(algorithm, 1, stock_first)
    cluster = [b for b in batches if b[0].config["phase"] == "cluster"]
    assert len(cluster) == 5 and [len(b) for b in cluster] == [4, 1, 1, 1, 1]
    assert batches.diagnostics["stock_trainings"] == 5
    assert clusters_of(algorithm, list(points)) == [{"0", "1"}, {"2", "3"}]  # 5 × 0.2 = 1.0, as client 0's point


# ---------------------------------------------------------------------------------- AdaCFL
STATS = {**{k: {"num-classes": 2, "label-entropy": 1.0} for k in "0123"},
         **{k: {"num-classes": 3, "label-entropy": 1.5} for k in "45"}}


def test_adacfl_preset_is_the_papers_setting():
    p = AdaCFL(**AdaCFL.PAPER).params
    assert (p.lambda_, p.epsilon, p.cluster_epochs, p.cluster_layers, p.distance) == (1.4, 1.8, 1, "smallest-fc", "l2")
    assert (p.chain_until, p.share_label_stats, p.entropy_gap, p.entropy_min_per_class) == ("epochs", True, 0.1, 0.0)


def test_adacfl_preset_preclusters_cuts_at_lambda_merges_and_places_newcomers_by_epsilon():
    """Pre-clusters (Alg. 1, line 6): clients 0-3 hold 2 classes at entropy 1.0, clients 4, 5
    hold 3 at 1.5, so {0-3} and {4, 5}, although every client holds only 2 examples per class
    (the default's entropy-min-per-class 5 would skip the step). Smallest-fc changes: 0 at
    (0, 0), 1 at (0.2, 0), 2 at (2, 0), 3 at (2.2, 0), 4 at (2.1, 0.5), 5 at (2.1, 0.7).
    Inside {0-3} at λ = 1.4: the pairs are 0.2 apart, average 2.0 between them: {0, 1},
    {2, 3}; {4, 5} (0.2 apart) is one cluster. The nearest clusters then merge while within
    λ (line 8): {2, 3} and {4, 5} at average (0.51 + 0.71 + 0.51 + 0.71) / 4 = 0.61; {0, 1}
    lies about 2 from both. So {0, 1} and {2-5}. References (0.1, 0) and (2.1, 0.3).
    Newcomers (Alg. 2, ε = 1.8): 6 at (0.3, 0) joins {0, 1} (0.2 away); 7 at (6, 0) is 3.9
    from the nearest reference: it founds a cluster; 8 at (6.5, 0), placed after it, joins
    7's (0.5 away)."""
    points = {"0": (0.0, 0.0), "1": (0.2, 0.0), "2": (2.0, 0.0), "3": (2.2, 0.0), "4": (2.1, 0.5), "5": (2.1, 0.7),
              "6": (0.3, 0.0), "7": (6.0, 0.0), "8": (6.5, 0.0)}
    keys = list(points)
    algorithm = build(AdaCFL, AdaCFL.PAPER, keys, stats=STATS, examples=4)
    hand(algorithm).active = keys[:6]
    respond = responder(points, "fc1")
    (warmup,) = drive_round(algorithm, 1, respond)  # FedAvg warm-up, one cluster
    assert {ask.config["phase"] for ask in warmup} == {"train"} and len(set(algorithm.assignment.values())) == 1
    batches = drive_round(algorithm, 2, respond)
    cluster_asks = batches[0]
    assert all(ask.upload == ["fc1.weight", "fc1.bias"] and ask.config["local-epochs"] == 1 for ask in cluster_asks)
    assert batches.diagnostics["preclustering"] is True and batches.diagnostics["num_preclusters"] == 2
    assert batches.diagnostics["clusters_within_preclusters"] == 3
    assert clusters_of(algorithm, keys[:6]) == [{"0", "1"}, {"2", "3", "4", "5"}]
    hand(algorithm).active = keys
    drive_round(algorithm, 3, respond)
    assert clusters_of(algorithm, keys) == [{"0", "1", "6"}, {"2", "3", "4", "5"}, {"7", "8"}]
    assert [e["new_cluster"] for e in algorithm.state.newcomer_log] == [False, True, False]
    assert "cut inside 2 entropy pre-clusters into 3 clusters, merged across pre-clusters at lambda to 2" in \
        algorithm.cluster_count_basis()

    # the defaults: too few examples per class, so no pre-clustering
    default = build(AdaCFL, {"lambda_": 1.4, "cluster_layers": "smallest-fc", "distance": "l2"}, keys[:6], stats=STATS,
                    examples=4)
    drive_round(default, 1, respond)
    assert "preclustering_skipped" in drive_round(default, 2, respond).diagnostics
