"""The CFL family with many small clients: principal-component similarities where raw cosines
of noisy updates show no groups, and what a run says about its cluster count
(``cluster_count_basis``, ``over_split_reason``, the numbers behind ``one_cluster_reason``)."""

import io
import json

import numpy as np
from sklearn.metrics import adjusted_rand_score
from harness import hand, round_of
from test_cfl import make_strategy, run_round
from test_hicfl import UNIT, two_opposite_groups

from clusterfed.clustering.bipartition import bipartition
from clusterfed.config import parse_config
from clusterfed.strategies.base import steps
from clusterfed.core.exchange import ClientInfo, TrainReply
from clusterfed.clustering.principal_scores import principal_scores
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix
from clusterfed.cluster_misses import cluster_miss_reason
from clusterfed.results import RunRecorder
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.strategies.cfl import pooled_vectors, similarity_pool
from clusterfed.explain import bipartition as explain
import pytest


def noisy_groups(m, d, strength, seed=0, groups=2):
    """m updates of dimension d: ± ``strength`` along one direction per group pair, plus unit noise
    per coordinate (a small client's update: the group's pull is far below its batch noise)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(m) % groups
    means = rng.standard_normal((groups, d))
    means *= strength / np.linalg.norm(means, axis=1, keepdims=True)
    return labels, means[labels] + rng.standard_normal((m, d))


def test_principal_scores_separate_groups_that_raw_cosines_do_not():
    labels, U = noisy_groups(400, 2000, 7.0, groups=4)
    raw = cosine_similarity_matrix(U)
    assert best_cut_silhouette(raw, 6)[0] < 0.05  # raw cosines of noisy updates: no structure
    scores = principal_scores(U, 5)
    assert scores.shape == (400, 5)
    projected = cosine_similarity_matrix(scores)
    assert best_cut_silhouette(projected, 6)[0] > 0.4
    side_a, side_b = bipartition(projected)
    for side in (side_a, side_b):  # every group on one side
        assert all(np.sum(labels[side] == g) in (0, 100) for g in range(4))


def test_principal_scores_keep_pairwise_geometry_of_a_low_rank_set():
    rng = np.random.default_rng(1)
    U = rng.standard_normal((30, 3)) @ rng.standard_normal((3, 50))
    scores = principal_scores(U, 5)  # rank 3 after centring: zero-variance components dropped
    assert scores.shape == (30, 3)
    centred = U - U.mean(axis=0)
    assert np.allclose(scores @ scores.T, centred @ centred.T)


WIDE = {"fc1.weight": (10, 200), "fc1.bias": (10,)}  # a one-layer "model" of 2,010 numbers
WIDE_DIM = 2010


def wide_arrays(vector):
    return {"fc1.weight": vector[:2000].reshape(10, 200).astype(np.float32),
            "fc1.bias": vector[2000:].astype(np.float32)}


def wide_cfl(labels, **config):
    """CFL on the wide model with one client per label, admitted to the root (no Grid); the
    paper's timing (split-timing = criteria) with criteria always met: a round's proposed split
    is judged in that round, not deferred to a second round's agreement (the evidence default)."""
    values = {"num-clients": len(labels), "out-dir": "/tmp/unused", "strategy": "cfl", "split-criteria": "absolute",
              "eps1": 1e6, "eps2": 1e-6, "min-split-round": 1, "split-timing": "criteria", **config}
    strategy = parse_config(values).build_strategy()
    hand(strategy).train_config = {"lr": 0.05}
    strategy.init(wide_arrays(np.zeros(WIDE_DIM)), hand(strategy).train_config)
    for i, group in enumerate(labels):
        hand(strategy).clients[str(i)] = ClientInfo(str(i), 50, int(group))
    hand(strategy).active = [str(i) for i in range(len(labels))]
    list(steps(strategy.admit(round_of(strategy, 1), hand(strategy).active)))
    return strategy


def wide_round(strategy, server_round, U):
    replies = [TrainReply(key=str(i), cluster=strategy.assignment[str(i)], arrays=wide_arrays(u),
                          sent=strategy.models[strategy.assignment[str(i)]], num_examples=50, train_loss=0.0,
                          metrics={}, is_update=True) for i, u in enumerate(U)]
    strategy.after_train(round_of(strategy, server_round), replies)


@pytest.mark.end_to_end
def test_cfl_splits_many_noisy_clients_on_principal_components_and_the_paper_does_not():
    labels, U = noisy_groups(200, WIDE_DIM, 5.5, seed=3)
    found = {}
    for rank in ("auto", 0):
        strategy = wide_cfl(labels, **{"similarity-rank": rank, "merge": False})
        wide_round(strategy, 1, U)
        found[rank] = strategy
    auto, paper = found["auto"], found[0]
    assert len(auto.state.splits) == 1 and auto.state.splits[0]["similarity_rank"] == 5
    assert auto.state.splits[0]["required_silhouette"] == auto.state.splits[0]["reference_silhouette"]  # beat group-free updates
    assert adjusted_rand_score(labels, [auto.assignment[str(i)] for i in range(200)]) >= 0.9
    assert paper.state.splits == [] and paper.state.refused[0]["similarity_rank"] == 0  # raw cosines: no structure
    reason = paper.one_cluster_reason()
    assert "closest refusal: round 1, cluster 0 (200 repliers): best-cut silhouette" in reason and "< required" in reason


@pytest.mark.end_to_end
def test_the_basis_names_the_splits_and_the_refused_merge_and_the_recorder_writes_the_over_split(tmp_path):
    labels, U = noisy_groups(200, WIDE_DIM, 5.5, seed=3)
    strategy = wide_cfl(labels, **{"similarity-rank": "auto", "merge-min-cosine": 0.99})
    wide_round(strategy, 1, U)
    wide_round(strategy, 2, U)  # both sides reply: the merge is judged and refused
    basis = strategy.cluster_count_basis()
    assert basis.startswith("1 splits accepted (closest to their threshold: round 1, cluster 0: best-cut silhouette")
    assert "0 merges; no further merge: the closest pair of leaves (round 2, clusters 1 and 2) had round cosine" in basis
    assert "< merge-min-cosine 0.99" in basis
    clusters = strategy.final_clusters()
    assert clusters["cluster_count_basis"] == basis
    keys = [str(i) for i in range(200)]
    one_group, groups = {k: 0 for k in keys}, {k: int(g) for k, g in zip(keys, labels)}
    assert cluster_miss_reason({"final_ari": 0.0}, clusters, one_group) == (
        "over_split_reason", f"2 clusters for 1 true groups: {basis}")
    assert cluster_miss_reason({"final_ari": 0.98}, clusters, groups) is None  # as many clusters as groups
    assert cluster_miss_reason({"final_ari": 0.95}, clusters, one_group) is None  # ARI high enough
    stream = io.StringIO()
    recorder = RunRecorder(tmp_path, {"strategy": "cfl"}, stream=stream)
    recorder.true_groups.update(one_group)
    recorder.rounds.append({"round": 1, "accuracy": 0.5, "ari": 0.0, "num_clusters": 2})
    summary = recorder.finish(1.0, clusters)
    assert json.loads((tmp_path / "summary.json").read_text())["over_split_reason"] == summary["over_split_reason"]
    assert summary["over_split_reason"].startswith("2 clusters for 1 true groups: 1 splits accepted")
    assert f"over-split: {summary['over_split_reason']}" in stream.getvalue()


def test_every_miss_with_several_clusters_is_named_fewer_and_mixed_as_well_as_more():
    basis = "1 splits accepted (closest to their threshold: round 1, cluster 0: best-cut silhouette 0.31 vs 0.30)"
    clusters = {"assignment": {"a": 0, "b": 0, "c": 1, "d": 1}, "cluster_count_basis": basis}
    three = {"a": 0, "b": 1, "c": 2, "d": 2}  # two clusters for three groups
    crossed = {"a": 0, "b": 1, "c": 0, "d": 1}  # two clusters for two groups, each cluster mixing both
    assert cluster_miss_reason({"final_ari": 0.5}, clusters, three) == (
        "under_split_reason", f"2 clusters for 3 true groups: {basis}")
    key, sentence = cluster_miss_reason({"final_ari": -0.5}, clusters, crossed)
    assert key == "mixed_clusters_reason" and sentence.startswith("2 clusters for 2 true groups, but their members mix")
    assert "(ARI -0.50)" in sentence and sentence.endswith(basis)
    assert cluster_miss_reason({"final_ari": 0.95}, clusters, three) is None  # a good enough clustering
    assert cluster_miss_reason({"final_ari": 0.0}, {**clusters, "cluster_count_basis": None}, three) is None
    one = {"assignment": {"a": 0, "b": 0}, "cluster_count_basis": basis}
    assert cluster_miss_reason({"final_ari": 0.0}, one, {"a": 0, "b": 1}) is None  # one_cluster_reason's case
    assert cluster_miss_reason({"final_ari": 0.5}, clusters, three)[0] != "over_split_reason"  # fewer is not one


def test_one_cluster_reasons_give_their_numbers():
    labels, U = noisy_groups(12, WIDE_DIM, 0.0, seed=4)
    # the paper's timing (split-timing = criteria): the reason is the criteria's, with their numbers
    strategy = wide_cfl(labels, **{"split-criteria": "relative", "split-timing": "criteria"})
    for server_round in (1, 2, 3):  # growing updates: never near-stationary
        wide_round(strategy, server_round, U * (1 + server_round))
    reason = strategy.one_cluster_reason()
    assert "criteria never met" in reason and "round 3: mean-update norm" in reason and "vs rel-eps1 × peak" in reason
    groups, updates = two_opposite_groups(0, oscillate_until=100)  # stability never settles
    hicfl = make_strategy(HiCFL, groups, **UNIT)
    for server_round in range(1, 13):
        run_round(hicfl, server_round, updates(server_round))
    reason = hicfl.one_cluster_reason()
    assert "stability" in reason and "round 12: nearest layer" in reason and ">= ε" in reason


@pytest.mark.end_to_end
def test_the_basis_says_why_no_further_split_came():
    labels, U = noisy_groups(200, WIDE_DIM, 5.5, seed=3)
    strategy = wide_cfl(labels, **{"similarity-rank": "auto", "merge-min-cosine": 0.99})
    wide_round(strategy, 1, U)
    wide_round(strategy, 2, U)  # both sides try to split again on noise and are refused
    tail = strategy.cluster_count_basis().split("; no further split: ")[1]
    assert explain.refusal_codes(strategy.state) == ["silhouette", "silhouette"]
    assert tail.startswith("2 split attempts refused: silhouette ×2; closest refusal: round 2, cluster ")
    assert "best-cut silhouette" in tail and "< required" in tail


def test_hicfls_basis_shows_the_stability_that_fired_the_last_split_as_below_epsilon():
    groups, updates = two_opposite_groups(0, oscillate_until=6)  # settles after round 6: splits at round 9
    hicfl = make_strategy(HiCFL, groups, **UNIT)
    for server_round in range(1, 12):
        run_round(hicfl, server_round, updates(server_round))
    assert [s["round"] for s in hicfl.state.splits] == [9]
    tail = hicfl.cluster_count_basis().split("; no further split: ")[1]
    assert tail == "no split attempt refused; the timing rule's last round 9: nearest layer fc1, all member's " \
                   "stability 0.333 < ε 0.500"


def partial_round(strategy, server_round, U, keys):
    """Only ``keys`` reply this round (a 10 % sample), each with its row of U; a key a split left
    unplaced would descend the tree first in a run: not replayed here."""
    keys = [k for k in keys if k in strategy.assignment]
    replies = [TrainReply(key=k, cluster=strategy.assignment[k], arrays=wide_arrays(U[int(k)]),
                          sent=strategy.models[strategy.assignment[k]], num_examples=50, train_loss=0.0,
                          metrics={}, is_update=True) for k in keys]
    strategy.after_train(round_of(strategy, server_round), replies)


@pytest.mark.end_to_end
def test_similarity_pool_members_judges_a_split_on_every_member_where_a_sample_is_too_small():
    labels, U = noisy_groups(200, WIDE_DIM, 5.5, seed=3)
    found = {}
    for pool in ("repliers", "members"):
        strategy = wide_cfl(labels, **{"cfl.similarity-rank": "auto", "cfl.merge": False, "cfl.similarity-pool": pool,
                                       "cfl.similarity-decay": 0})
        for server_round in range(1, 11):  # 20 different clients a round: each replies once
            partial_round(strategy, server_round, U, [str(i) for i in range(20 * (server_round - 1), 20 * server_round)])
        found[pool] = strategy
    repliers, members = found["repliers"], found["members"]
    assert repliers.state.splits == [] and len(repliers.state.refused) == 10  # 20 updates a round show no groups
    assert all(len(r["members"][0]) + len(r["members"][1]) == 20 for r in repliers.state.refused)
    (split,) = members.state.splits  # at round 5, judged on the 100 clients that had replied by then
    assert split["round"] == 5 and sum(len(side) for side in split["members"]) == 100
    compared = [str(i) for i in range(100)]
    assert adjusted_rand_score(labels[:100], [members.assignment[k] for k in compared]) > 0.9  # the two groups
    assert [len(side) for side in split["absent"]] == [0, 0]  # every member placed had replied
    assert len(split["unplaced"]) == 100  # the 100 never heard from wait, unplaced, until sampled


def test_similarity_pool_is_the_papers_repliers_by_default():
    strategy = wide_cfl(np.arange(4) % 2)
    assert strategy.params.similarity_pool == "repliers"
    assert similarity_pool(strategy.params, strategy.state, 0, ["1", "0"]) == ["1", "0"]


@pytest.mark.end_to_end
def test_similarity_pool_members_lets_a_merge_compare_every_members_stored_update():
    labels, U = noisy_groups(200, WIDE_DIM, 5.5, seed=3)
    found = {}
    for pool in ("repliers", "members"):
        strategy = wide_cfl(labels, **{"cfl.similarity-rank": "auto", "cfl.merge": False, "cfl.similarity-pool": pool})
        wide_round(strategy, 1, U)  # everyone replies: one split, every client's vector stored
        found[pool] = strategy
    for pool, strategy in found.items():
        (split,) = strategy.state.splits
        leaves = sorted(set(strategy.assignment.values()))
        # a later round: two repliers per leaf
        sample = {c: [k for k in sorted(strategy.assignment, key=int) if strategy.assignment[k] == c][:2] for c in leaves}
        groups = {c: [TrainReply(key=k, cluster=c, arrays=wide_arrays(U[int(k)]), sent=strategy.models[c],
                                 num_examples=50, train_loss=0.0, metrics={}, is_update=True) for k in keys]
                  for c, keys in sample.items()}
        compared = pooled_vectors(strategy.params, strategy.state, groups, strategy.decision_names())
        sizes = {c: len(compared[c]) for c in leaves}
        members = {c: sum(1 for v in strategy.assignment.values() if v == c) for c in leaves}
        assert sizes == ({c: 2 for c in leaves} if pool == "repliers" else members)
