"""AdaCFL end to end on digits (in-process engine): warm-up, entropy pre-clustering,
partial upload of the smallest fc layer, groups recovered, the ε rule for newcomers, and
the opt-out of label statistics."""

from __future__ import annotations

import json

import pytest

from clusterfed import protocol
from clusterfed.clustering.evidence_sketch import plan
from clusterfed.config import parse_config
from clusterfed.models import select_layers
from clusterfed.models.layers import matrix_layers
from clusterfed.server_app import initial_arrays
from clusterfed.simulation import simulate

# the structured setting of test_fedclust.py: three groups of digit pairs, four clients each
STRUCTURED = {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5", "num-clients": 12, "batch-size": 32,
              "newcomer-fraction": 0.2, "newcomer-round": 3, "rounds": 3, "strategy": "adacfl"}


def run(tmp_path, **values):
    config = parse_config({"out-dir": str(tmp_path), **STRUCTURED, **values})
    simulate(config, engine="inprocess", stream=None)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    clusters = json.loads((tmp_path / "clusters.json").read_text())
    return config, rounds, clusters


def model_and_layer_bytes(config, rule: str) -> tuple[int, int]:
    theta0 = protocol.from_array_record(initial_arrays(config))
    return sum(a.nbytes for a in theta0.values()), sum(theta0[k].nbytes for k in select_layers(theta0, rule))


@pytest.fixture(scope="module")
def with_stats(tmp_path_factory):
    """Defaults: 1 warm-up round, label statistics shared, ε auto; 2 of 12 clients join in round 3."""
    return run(tmp_path_factory.mktemp("adacfl"))


@pytest.fixture(scope="module")
def without_stats(tmp_path_factory):
    """No label statistics, no warm-up (clustering in round 1), and an ε so small that
    every newcomer founds its own cluster."""
    return run(tmp_path_factory.mktemp("adacfl-nostats"),
               **{"share-label-stats": False, "warmup-rounds": 0, "epsilon": 1e-9})


def test_warm_up_then_the_true_groups(with_stats):
    _, rounds, clusters = with_stats
    assert rounds[0]["num_clusters"] == 1 and "lambda_used" not in rounds[0]  # FedAvg warm-up
    assert rounds[1]["lambda_used"] > 0 and clusters["clustering_round"] == 2
    assert rounds[1]["ari"] == 1.0 and rounds[1]["num_clusters"] == 3
    assert rounds[1]["preclustering"] is True and clusters["preclustering"] is True
    # digit pairs: every client has two classes of near-equal entropy, so one pre-cluster
    assert rounds[1]["num_preclusters"] == 1 and set(clusters["preclusters"]) == {0}


def test_clustering_uploads_every_candidate_layer_once(with_stats):
    config, rounds, clusters = with_stats
    theta0 = protocol.from_array_record(initial_arrays(config))
    model_bytes = sum(a.nbytes for a in theta0.values())
    layers = matrix_layers(theta0)
    chosen = clusters["layer_choice"]["chosen"]
    assert clusters["layers"] == select_layers(theta0, chosen)
    # evidence-sketch (the default): each candidate array's update projected within the paper layer's
    # (the smallest fc layer's) bytes, its kept numbers two a byte behind a float32 scale
    _, paper = model_and_layer_bytes(config, "smallest-fc")
    sizes = plan({k: (theta0[k].shape, theta0[k].dtype) for keys in layers.values() for k in keys}, layers, paper,
                 config.seed)["sizes"]
    per_client = sum(4 + (min(k, theta0[n].size) + 1) // 2 for n, k in sizes.items())
    assert per_client <= paper and set(sizes) == {k for keys in layers.values() for k in keys}
    assert rounds[1]["clustering_bytes_up"] == per_client * 10  # 12 clients, 2 held back
    # clustering phase + the round's training, one model down per client each time
    assert rounds[1]["bytes_down"] == model_bytes * 10 * 2
    assert rounds[1]["bytes_up"] == per_client * 10 + model_bytes * 10
    assert rounds[0]["bytes_down"] == model_bytes * 10  # warm-up: one model per client


def test_newcomers_join_their_group_under_the_default_epsilon(with_stats):
    _, rounds, clusters = with_stats
    newcomers = clusters["newcomers"]
    assert len(newcomers) == 2 and rounds[2]["newcomers_placed"] == 2
    assert all(n["round"] == 3 and not n["new_cluster"] and n["matches_true_group"] for n in newcomers)
    assert rounds[2]["ari"] == 1.0 and len(clusters["assignment"]) == 12


def test_without_label_stats_pre_clustering_is_skipped(without_stats):
    _, rounds, clusters = without_stats
    assert rounds[0]["preclustering"] is False and clusters["preclustering"] is False
    assert rounds[0]["num_preclusters"] == 1
    # no warm-up: the clustering round is round 1, and the weights alone find the groups
    assert clusters["clustering_round"] == 1 and rounds[0]["ari"] == 1.0


def test_a_newcomer_farther_than_epsilon_founds_a_cluster(without_stats):
    _, rounds, clusters = without_stats
    newcomers = clusters["newcomers"]
    assert len(newcomers) == 2 and all(n["new_cluster"] for n in newcomers)
    assert len({n["cluster"] for n in newcomers}) == 2  # the second does not join the first's (ε is tiny)
    assert rounds[2]["num_clusters"] == 5
    # their groups already have clusters, so founding a new one is not a match
    assert not any(n["matches_true_group"] for n in newcomers)


def test_pre_clustering_is_skipped_when_clients_hold_too_few_examples_per_class(tmp_path):
    """About 120 training digits of two classes per client: 60 per class, below a
    required 100, so the class counts and entropies are not trusted; the weights alone
    still find the groups."""
    _, rounds, clusters = run(tmp_path, **{"adacfl.entropy-min-per-class": 100, "newcomer-fraction": 0.0})
    assert rounds[1]["preclustering"] is False and clusters["preclustering"] is False
    assert "< entropy-min-per-class 100" in rounds[1]["preclustering_skipped"]
    assert rounds[1]["ari"] == 1.0
