"""FedClust end to end on digits (in-process engine): groups recovered, partial upload
counted exactly, one model down per client, newcomers placed, λ = auto on IID data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clusterfed import protocol
from clusterfed.clustering.evidence_sketch import plan
from clusterfed.config import parse_config
from clusterfed.models import select_layers
from clusterfed.models.layers import matrix_layers
from clusterfed.plots.clustering import plot_clustering_figures
from clusterfed.server_app import initial_arrays
from clusterfed.simulation import simulate

# Three groups of digit pairs, four clients each: they separate clearly in the final layer
# (silhouette 0.72-0.76 over seeds 0-3). Five-digit groups of four clients do not: their
# members' label mixes differ enough to split a group.
STRUCTURED = {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5", "num-clients": 12, "batch-size": 32}


def run(tmp_path, name: str, **values):
    config = parse_config({"out-dir": str(tmp_path / name), **STRUCTURED, **values})
    summary = simulate(config, engine="inprocess", stream=None)
    out = tmp_path / name
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    clusters = json.loads((out / "clusters.json").read_text())
    return config, summary, rounds, clusters


def model_and_layer_bytes(config, rule: str) -> tuple[int, int]:
    theta0 = protocol.from_array_record(initial_arrays(config))
    layer = select_layers(theta0, rule)
    return sum(a.nbytes for a in theta0.values()), sum(theta0[k].nbytes for k in layer)


@pytest.fixture(scope="module")
def fedclust_with_newcomers(tmp_path_factory):
    """3 rounds; 2 of 12 clients held back until round 3."""
    return run(tmp_path_factory.mktemp("fedclust"), "run", strategy="fedclust", rounds=3,
               **{"newcomer-fraction": 0.2, "newcomer-round": 3})


def test_recovers_the_true_groups_in_the_clustering_round(fedclust_with_newcomers):
    _, summary, rounds, clusters = fedclust_with_newcomers
    first = rounds[0]
    assert first["ari"] == 1.0 and first["num_clusters"] == 3
    assert first["lambda_used"] > 0 and first["silhouette"] > 0.25
    assert summary["final_ari"] == 1.0
    # every clustering-round client, grouped exactly by its true group
    groups = [clusters["true_groups"][k] for k in clusters["client_order"]]
    by_label = {label: {g for g, lab in zip(groups, clusters["labels"]) if lab == label} for label in clusters["labels"]}
    assert all(len(g) == 1 for g in by_label.values())


def candidate_bytes(config) -> int:
    theta0 = protocol.from_array_record(initial_arrays(config))
    return sum(theta0[k].nbytes for keys in matrix_layers(theta0).values() for k in keys)


def projected_bytes(config, names=None) -> int:
    """What a client sends of the candidate layers (``names``: of these arrays) with
    evidence-sketch on: each array's update projected to its share of the paper layer's
    (fc2's) bytes, its kept numbers two a byte behind a float32 scale (the plan rebuilt here)."""
    theta0 = protocol.from_array_record(initial_arrays(config))
    layers = matrix_layers(theta0)
    _, budget = model_and_layer_bytes(config, "final")
    sizes = plan({k: (theta0[k].shape, theta0[k].dtype) for keys in layers.values() for k in keys}, layers, budget,
                 config.seed)["sizes"]
    return sum(4 + (min(sizes[n], theta0[n].size) + 1) // 2 for n in (names or sizes))


def test_clustering_uplink_is_every_candidate_layer_once_then_the_chosen_one(fedclust_with_newcomers):
    config, _, rounds, clusters = fedclust_with_newcomers
    _, layer_bytes = model_and_layer_bytes(config, "final")
    replying = len(clusters["client_order"])
    assert replying == 10  # 12 clients, 2 held back
    # cluster-layers = auto: each candidate layer uploaded in the clustering phase, scored; with
    # evidence-sketch (the default) each projected: at most fc2's bytes, under a quarter of the model's
    per_client = projected_bytes(config)
    assert rounds[0]["clustering_bytes_up"] == per_client * replying
    assert layer_bytes - 4 * 8 <= per_client <= layer_bytes and per_client <= candidate_bytes(config) / 4
    choice = clusters["layer_choice"]
    assert [s["layer"] for s in choice["scores"]] == list(matrix_layers(protocol.from_array_record(initial_arrays(config))))
    # digit pairs: the classifier head separates the groups best
    assert choice["chosen"] == "fc2" and clusters["layers"] == ["fc2.weight", "fc2.bias"]
    assert rounds[0]["decision"].startswith("FedClust compared fc2.weight, fc2.bias (chosen by evidence")
    # newcomers upload only the chosen layer, in the clustering round's projected space (fc2 is
    # smaller than its share: kept whole, as 4-bit numbers)
    assert rounds[2]["newcomer_bytes_up"] == projected_bytes(config, clusters["layers"]) * 2 < layer_bytes * 2


def test_the_papers_rule_uploads_only_the_final_layer(tmp_path):
    config, _, rounds, clusters = run(tmp_path, "final", strategy="fedclust", rounds=1,
                                      **{"fedclust.cluster-layers": "final"})
    _, layer_bytes = model_and_layer_bytes(config, "final")
    assert rounds[0]["clustering_bytes_up"] == layer_bytes * 12
    assert clusters["layer_choice"]["scores"] == [] and clusters["layers"] == ["fc2.weight", "fc2.bias"]
    assert rounds[0]["ari"] == 1.0


def test_downlink_is_one_model_per_client(fedclust_with_newcomers):
    config, _, rounds, _ = fedclust_with_newcomers
    model_bytes, layer_bytes = model_and_layer_bytes(config, "final")
    # round 2 is a normal round: 10 placed clients trained, each sent its cluster's model only
    assert rounds[1]["transmissions"] == 10
    assert rounds[1]["bytes_down"] == model_bytes * 10
    assert rounds[1]["bytes_up"] == model_bytes * 10
    # round 1: θ0 to each clustering client, then its cluster model to train
    assert rounds[0]["bytes_down"] == model_bytes * 10 * 2
    assert rounds[0]["bytes_up"] == projected_bytes(config) * 10 + model_bytes * 10


def test_newcomers_are_placed_and_recorded(fedclust_with_newcomers):
    config, _, rounds, clusters = fedclust_with_newcomers
    newcomers = clusters["newcomers"]
    assert len(newcomers) == 2 and rounds[2]["newcomers_placed"] == 2
    for entry in newcomers:
        assert entry["round"] == 3 and entry["new_cluster"] is False  # FedClust never founds one
        assert entry["matches_true_group"] is True
        assert clusters["assignment"][entry["client"]] == entry["cluster"]
        assert entry["client"] not in clusters["client_order"]
    assert len(clusters["assignment"]) == 12 and rounds[2]["ari"] == 1.0
    model_bytes, _ = model_and_layer_bytes(config, "final")
    # newcomers receive θ0 for placement, then all 12 clients train
    assert rounds[2]["bytes_down"] == model_bytes * 2 + model_bytes * 12


def test_clusters_json_holds_what_the_figures_need(fedclust_with_newcomers, tmp_path):
    _, _, _, clusters = fedclust_with_newcomers
    m = len(clusters["client_order"])
    D = np.array(clusters["distance_matrix"])
    assert D.shape == (m, m) and np.allclose(D, D.T) and np.all(np.diag(D) == 0)
    assert np.array(clusters["linkage"]).shape == (m - 1, 4)
    assert len(clusters["labels"]) == m and isinstance(clusters["lambda"], float)
    # heights above λ are exactly the merges between clusters
    assert sum(h > clusters["lambda"] for h in np.array(clusters["linkage"])[:, 2]) == len(set(clusters["labels"])) - 1
    (tmp_path / "clusters.json").write_text(json.dumps(clusters))
    written = plot_clustering_figures(tmp_path)
    assert {p.name for p in written} == {"distance_matrix.png", "dendrogram.png"}
    assert all(p.stat().st_size > 0 for p in written)


def test_auto_lambda_keeps_iid_clients_in_one_cluster(tmp_path):
    _, summary, rounds, clusters = run(tmp_path, "iid", strategy="fedclust", rounds=1, partitioner="iid")
    assert rounds[0]["num_clusters"] == 1 and summary["num_clusters"] == 1
    assert rounds[0]["silhouette"] is None  # one cluster: no partition to score
    if rounds[0]["auto_best_silhouette"] < 0.25:  # the best cut fell short of auto-min-silhouette
        assert clusters["lambda"] > max(np.array(clusters["linkage"])[:, 2])
    else:  # a cut at the bar (0.26 on projected evidence, seed 0) is deferred: its halves disagree or
        # it scores no better than group-free rotations of the rows
        assert "FedClust: cut deferred: " in rounds[0]["decision"]
        assert ("coordinate halves disagree" in rounds[0]["decision"]
                or "no better than group-free rotations" in rounds[0]["decision"])


def test_numeric_lambda_cuts_at_that_height(tmp_path):
    _, _, rounds, clusters = run(tmp_path, "big", strategy="fedclust", rounds=1, **{"lambda": 1e6, "num-clients": 6,
                                                                                "cluster-epochs": 1})
    assert rounds[0]["num_clusters"] == 1 and rounds[0]["lambda_used"] == 1e6 and clusters["lambda"] == 1e6


def test_cluster_sample_clusters_a_sample_and_places_the_rest(tmp_path):
    """``cluster-sample`` below the number of clients: the sampled clustering still finds
    the three groups and every client is placed."""
    _, summary, rounds, clusters = run(tmp_path, "sampled", strategy="fedclust", rounds=1,
                                       **{"cluster-sample": 8, "cluster-epochs": 10})
    assert rounds[0]["ari"] == 1.0 and rounds[0]["num_clusters"] == 3
    assert len(clusters["assignment"]) == 12
    assert clusters["cluster_sample"] == 8 and rounds[0]["clustering_bytes_up"] > 0
