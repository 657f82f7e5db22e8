"""AdaCFL on many small, noisy clients (driven without Flower): the entropy pre-clustering
and the auto cut must not multiply the true groups.

The population mimics digit pairs at hundreds of clients of a few dozen examples: every
client holds two classes, in a proportion drawn at random, so its label entropy is spread
over (0, 1] and the paper's 10 % entropy gap cuts one group into several pre-clusters; its
clustering upload is its group's direction of change, moved one way or the other along a
direction of the group's own by which of its classes it holds more of (clients of a pair that
hold mostly one digit train differently from those that hold mostly the other: on MNIST pairs
the best-silhouette cut halves groups that way), plus noise."""

from __future__ import annotations

import numpy as np
import pytest
from harness import drive_round, hand, make, trained
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering import cluster_by_threshold, cluster_within_preclusters, merge_across_preclusters
from clusterfed.strategies.adacfl import AdaCFL

GROUPS, CLIENTS = 4, 240


def population(seed: int = 0, spread: float = 0.42, noise: float = 0.08):
    """(true group, label stats, change of the uploaded layer as a function of its size) per client."""
    rng = np.random.default_rng(seed)
    clients = {}
    for i in range(CLIENTS):
        p = rng.uniform(0.15, 0.85)  # the share of the client's first class
        entropy = float(-(p * np.log2(p) + (1 - p) * np.log2(1 - p)))
        clients[str(i)] = (i % GROUPS, {"num-classes": 2, "label-entropy": entropy}, np.sign(p - 0.5))
    return clients, rng, spread, noise


def run_adacfl(**params):
    clients, rng, spread, noise = population()
    groups = {key: group for key, (group, _, _) in clients.items()}
    algorithm = make(AdaCFL, groups, stats={key: stats for key, (_, stats, _) in clients.items()},
                     examples={key: 25 for key in clients}, **params)
    size = sum(algorithm.theta0[name].size for name in algorithm.layer_keys)
    basis = np.linalg.qr(rng.normal(size=(size, 2 * GROUPS)))[0].T  # orthonormal: a centre and an axis per group
    change = {key: basis[group] + spread * majority * basis[GROUPS + group] + rng.normal(0, noise, size)
              for key, (group, _, majority) in clients.items()}

    def respond(ask):
        if ask.config["phase"] != "cluster":
            return trained(ask, 0.0)
        flat, out, offset = change[ask.key], {}, 0
        for name in ask.upload:
            n = ask.model[name].size
            out[name] = ask.model[name] + flat[offset:offset + n].reshape(ask.model[name].shape).astype(np.float32)
            offset += n
        return out

    for server_round in (1, 2, 3):
        drive_round(algorithm, server_round, respond)
    truth = [groups[key] for key in algorithm.assignment]
    return algorithm, adjusted_rand_score(truth, list(algorithm.assignment.values()))


def test_many_small_clients_are_cut_into_their_groups_not_dozens():
    algorithm, ari = run_adacfl()
    state = algorithm.cluster_state()
    assert len(state["precluster_cuts"]) >= 4  # the paper's entropy gap cuts every group into bands
    assert state["clusters_within_preclusters"] > 2 * GROUPS
    assert len(set(algorithm.assignment.values())) == GROUPS and ari == pytest.approx(1.0)
    basis = algorithm.cluster_count_basis()
    assert basis.startswith(f"{GROUPS} clusters:") and "merged across pre-clusters at lambda" in basis


def test_the_papers_union_of_pre_cluster_cuts_stays_selectable_and_over_splits():
    # the union as taken (reproduce = false); by default its over-split does not reproduce
    algorithm, ari = run_adacfl(**{"adacfl.precluster_merge": False, "adacfl.reproduce": False})
    assert len(set(algorithm.assignment.values())) > 2 * GROUPS and ari < 0.7
    assert algorithm.cluster_state()["clusters_within_preclusters"] == len(set(algorithm.assignment.values()))
    # by default the union's cut does not reproduce: the clients keep their pre-clusters, and the line says so
    deferred, _ = run_adacfl(**{"adacfl.precluster_merge": False})
    pre = len(deferred.cluster_state()["precluster_cuts"])
    assert len(set(deferred.assignment.values())) == pre < len(set(algorithm.assignment.values()))
    said = deferred.cluster_state()["deferred"]
    assert "cut deferred: coordinate halves disagree" in said and f"the {pre} label-statistics pre-clusters" in said


def test_auto_tolerance_zero_takes_the_best_silhouette_which_halves_elongated_groups():
    tolerant, _ = run_adacfl(**{"adacfl.share_label_stats": False})
    best, ari = run_adacfl(**{"adacfl.share_label_stats": False, "adacfl.auto_tolerance": 0.0})
    state = best.cluster_state()
    assert len(set(tolerant.assignment.values())) == GROUPS
    assert state["auto_clusters"] == state["auto_best_clusters"] > GROUPS and ari < 0.95
    assert "the best-silhouette cut of all" in best.cluster_count_basis()
    assert "within auto-tolerance 0.05" in tolerant.cluster_count_basis()


@pytest.mark.parametrize(("metric", "linkage"), [("l2", "average"), ("cosine", "average"), ("l2", "single"),
                                                 ("l2", "complete"), ("l2", "ward")])
def test_merging_from_single_clients_is_the_dendrogram_cut_at_lambda(metric, linkage):
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(centre, 1.0, (20, 6)) for centre in (0.0, 3.0, 6.0)])
    for lam in (0.5, 2.0, 4.0, 9.0):
        merged = merge_across_preclusters(X, np.arange(len(X)), lam, metric="l2" if linkage == "ward" else metric,
                                          linkage=linkage)
        cut = cluster_by_threshold(X, lam, metric="l2" if linkage == "ward" else metric, linkage=linkage)
        assert merged.tolist() == cut.tolist()


def test_groups_split_across_pre_clusters_are_merged_back():
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.normal(centre, 0.3, (30, 5)) for centre in (0.0, 5.0, 10.0)])
    pre = rng.integers(0, 5, len(X))  # pre-clusters unrelated to the groups
    within = cluster_within_preclusters(X, pre, 3.0)
    merged = merge_across_preclusters(X, within, 3.0)
    assert within.max() + 1 > 3 and merged.max() + 1 == 3
    assert adjusted_rand_score(np.repeat([0, 1, 2], 30), merged) == 1.0


def noise_uploads(seed: int):
    """A harness client's answers: the model back in training rounds, noise on the uploaded
    layer in the clustering step (no groups in the weights)."""
    rng = np.random.default_rng(seed)

    def respond(ask):
        if ask.config["phase"] != "cluster":
            return trained(ask, 0.0)
        return {name: ask.model[name] + rng.normal(0, 0.1, ask.model[name].shape).astype(np.float32)
                for name in ask.upload}

    return respond


def test_a_sample_without_groups_stays_one_cluster_and_says_what_the_step_saw():
    """A quarter of 80 clients whose uploads are noise, the clustering step on the round's sample
    (``cluster-all-active = false``): one cluster, and the reason names the sample the one
    clustering step saw and the clients that joined it later; by default it saw all 80."""
    keys = [str(i) for i in range(80)]
    every = make(AdaCFL, {key: 0 for key in keys}, examples={key: 10 for key in keys}, fraction_train=0.25,
                 **{"adacfl.share_label_stats": False})
    for server_round in (1, 2):
        drive_round(every, server_round, noise_uploads(3), examples={key: 10 for key in keys})
    assert "the clustering step in round 2 saw 80 clients" in every.one_cluster_reason(hand(every).clients)
    algorithm = make(AdaCFL, {key: 0 for key in keys}, examples={key: 10 for key in keys}, fraction_train=0.25,
                     **{"adacfl.share_label_stats": False, "adacfl.cluster_all_active": False})
    respond = noise_uploads(3)
    for server_round in range(1, 7):
        drive_round(algorithm, server_round, respond, examples={key: 10 for key in keys})
    assert len(set(algorithm.assignment.values())) == 1
    reason = algorithm.one_cluster_reason(hand(algorithm).clients)  # the client table, as the driver hands it
    assert "the clustering step in round 2 saw 20 clients, median 10 examples each" in reason
    joined = len(algorithm.state.newcomer_log)
    assert joined > 0 and f"the {joined} clients placed later joined its one cluster" in reason
    assert algorithm.cluster_count_basis().startswith("1 cluster: lambda auto")


def test_pre_clusters_stay_apart_when_the_weights_show_no_structure():
    """Four well-separated entropy levels, uploads that are noise: the auto cut finds one
    cluster, whose λ lies above every merge; the pre-clusters stay the clusters."""
    keys = [str(i) for i in range(40)]
    stats = {key: {"num-classes": 4, "label-entropy": [0.5, 1.0, 1.5, 1.95][int(key) % 4]} for key in keys}
    algorithm = make(AdaCFL, {key: int(key) % 4 for key in keys}, stats=stats, examples={key: 40 for key in keys})
    respond = noise_uploads(4)
    for server_round in (1, 2):
        drive_round(algorithm, server_round, respond, examples={key: 40 for key in keys})
    state = algorithm.cluster_state()
    assert state["auto_clusters"] == 1 and len(state["precluster_cuts"]) == 4
    assert len(set(algorithm.assignment.values())) == 4
    truth = [int(key) % 4 for key in algorithm.assignment]
    assert adjusted_rand_score(truth, list(algorithm.assignment.values())) == 1.0
    assert "kept apart: the weights show no structure" in algorithm.cluster_count_basis()


def test_a_cut_that_beats_only_the_group_free_reference_is_bounded():
    """96 small clients of 4 groups, each made of 8 tight triples (clients of a few images
    that train alike) under much noise: the unbounded best cut takes the triples (silhouette
    below auto-min-silhouette, above the group-free reference); bounded at sqrt(96 / 2) = 6
    clusters, as FedClust bounds its re-cut, it finds the groups."""
    rng = np.random.default_rng(0)
    centres, rows, truth = rng.normal(0, 0.6, (4, 50)), [], []
    for group in range(4):
        for _ in range(8):
            triple = centres[group] + rng.normal(0, 0.6, 50)
            rows += [triple + rng.normal(0, 0.8, 50) for _ in range(3)]
            truth += [group] * 3
    X = np.array(rows)
    algorithm = make(AdaCFL, {str(i): 0 for i in range(4)})
    lam, info = algorithm.threshold(X)
    assert info["auto_max_clusters"] == 6 and info["auto_clusters"] == 4
    assert info["auto_reference_silhouette"] < info["auto_best_silhouette"] < 0.25
    assert adjusted_rand_score(truth, cluster_by_threshold(X, lam, metric="cosine")) == 1.0
    # the best cut then passes the fixed threshold: no bound
    unbounded = make(AdaCFL, {str(i): 0 for i in range(4)}, **{"adacfl.auto_min_silhouette": 0.2})
    _, info = unbounded.threshold(X)
    assert info["auto_max_clusters"] is None and info["auto_clusters"] > 6
