"""The CFL family splits on evidence (``split-timing = evidence``, the default): a split is taken
only when two successive rounds' updates give the same partition of the cluster's clients, a
merge never undoes a split that still reproduces, a merged cluster may split again, and round 1's
line says what is compared. Hand-made updates through the strategies' own ``after_train``."""

import numpy as np
import pytest
from harness import hand, reply_to, round_of
from test_cfl import DIM, arrays_of, make_strategy, run_round

from clusterfed.clustering.split_evidence import whole_parts_alike
from clusterfed.clustering.split_rules import most_alike_sides, part_cosines
from clusterfed.core.exchange import ClientInfo, Replies
from clusterfed.strategies.base import steps
from clusterfed.strategies.cfl import CFL
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.strategies.layercfl import LayerCFL

E = np.eye(DIM)
KEYS = [str(i) for i in range(12)]
GROUPS = {k: int(k) // 6 for k in KEYS}  # the partition P1: clients 0-5 | 6-11
P1 = [KEYS[:6], KEYS[6:]]
P2 = [KEYS[:3] + KEYS[6:9], KEYS[3:6] + KEYS[9:]]  # another clean partition, independent of P1
# the default timing (test_cfl's helper starts from the paper's, to test the tree's mechanics)
EVIDENCE = {"split-timing": "evidence", "min-split-round": 2}


def two_sides(sides, rng, noise=0.05, base=None):
    """Updates pointing one way for ``sides[0]`` and another for ``sides[1]`` (a clean cut)."""
    out = {}
    for i, side in enumerate(sides):
        for key in side:
            v = E[i] + noise * rng.standard_normal(DIM)
            out[key] = v if base is None else base + v
    return {k: out[k] for k in KEYS}


def one_direction(rng, noise=0.05):
    """Every client's update the same way: no structure."""
    return {k: E[5] + noise * rng.standard_normal(DIM) for k in KEYS}


def leaves(strategy):
    found = {}
    for key, cluster in strategy.assignment.items():
        found.setdefault(cluster, set()).add(key)
    return sorted(found.values(), key=lambda s: min(int(k) for k in s))


def test_a_split_is_deferred_while_rounds_disagree_and_taken_once_they_agree():
    rng = np.random.default_rng(0)
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    said = {}
    for server_round in (1, 2, 3, 4):  # each round a clean cut, but a different one each time
        said[server_round] = run_round(strategy, server_round, two_sides(P1 if server_round % 2 else P2, rng))
        assert strategy.state.splits == [] and len(set(strategy.assignment.values())) == 1
    for server_round in (2, 3, 4):
        text = said[server_round]["decision"]
        assert f"split of cluster 0 deferred: rounds {server_round - 1} and {server_round} disagree (ARI" in text
        assert said[server_round]["refused_splits"][0]["reason"] == "deferred"
    # round 5 cuts as round 4 did: the rounds agree, the split is taken, as both cut
    said[5] = run_round(strategy, 5, two_sides(P2, rng))
    assert [sorted(side, key=int) for side in strategy.state.splits[0]["members"]] == [sorted(s, key=int) for s in P2]
    reproduction = strategy.state.splits[0]["reproduction"]
    assert {k: reproduction[k] for k in ("source", "agreement", "clusters")} == {
        "source": "rounds 4 and 5", "agreement": 1.0, "clusters": [2, 2]}
    assert all(c < 0.6 for c in reproduction["alike"])  # its parts point apart in both rounds
    assert "cluster 0 split into 1 and 2 (6 | 6 clients): rounds 4 and 5 agree (ARI 1.00)" in said[5]["decision"]


def test_the_paper_timing_splits_on_the_first_clean_cut():
    """``split-timing = criteria`` (the PAPER preset's): no agreement asked for."""
    rng = np.random.default_rng(0)
    strategy = make_strategy(CFL, GROUPS, split_timing="criteria", split_criteria="absolute", eps1=1e6, eps2=1e-6,
                             min_split_round=2)
    run_round(strategy, 1, two_sides(P1, rng))
    run_round(strategy, 2, two_sides(P2, rng))
    assert len(strategy.state.splits) == 1 and strategy.state.splits[0]["round"] == 2
    assert CFL.paper().params.split_timing == "criteria" and HiCFL.paper().params.split_timing == "criteria"
    assert LayerCFL.paper().params.split_timing == "criteria"


def test_noise_never_splits_on_evidence():
    """No structure: every round's cut is refused or deferred, the cluster stays whole."""
    rng = np.random.default_rng(1)
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    for server_round in range(1, 9):
        run_round(strategy, server_round, one_direction(rng, noise=0.3))
    assert strategy.state.splits == []
    assert {r["reason"] for r in strategy.state.refused} <= {"silhouette", "deferred"}


def close_sides(rng, sides):
    """The two sides still cut apart exactly by complete linkage (every cross-side distance above
    every within-side one), but weakly (silhouette below merge-max-silhouette) and moving the same
    way (mean cosine above merge-min-cosine): what the merge rule alone would merge."""
    out = {}
    for i, side in enumerate(sides):
        for j, key in enumerate(side):
            out[key] = E[5] + 0.25 * E[i] + 0.3 * E[20 + int(key)]
    return {k: out[k] for k in KEYS}


def drift_alike(strategy):
    """Both leaves' models drifted the same way since their split (the drift test passes)."""
    for cluster in set(strategy.assignment.values()):
        model = strategy.state.models[cluster]
        moved = arrays_of(E[5])
        strategy.state.models[cluster] = {k: model[k] + moved[k] for k in model}


def split_on(strategy, sides, rng, first=1):
    for server_round in (first, first + 1):
        run_round(strategy, server_round, two_sides(sides, rng))
    assert leaves(strategy) == [set(s) for s in sides]


KEYS16 = [str(i) for i in range(16)]
FOUR = [KEYS16[4 * g:4 * g + 4] for g in range(4)]  # four true groups of 4; the split put 0, 1 | 2, 3
SPLIT_OF_FOUR = [FOUR[0] + FOUR[1], FOUR[2] + FOUR[3]]


def four_groups_alike_across(rng, noise=0.02):
    """Groups 0 and 2 differ only by ±0.5·E[3], as do groups 1 and 3: the two leaves' mean updates
    point alike (cosine above merge-min-cosine), their members' silhouette by leaf is low, and the
    members' best bi-partition is {0, 2} | {1, 3}, across the split; the four groups stay tight."""
    directions = [E[1] + 0.5 * E[3], E[2] + 0.5 * E[3], E[1] - 0.5 * E[3], E[2] - 0.5 * E[3]]
    return {k: 2 * E[5] + directions[int(k) // 4] + noise * rng.standard_normal(DIM) for k in KEYS16}


def test_a_merge_never_undoes_a_split_of_several_groups_whose_best_cut_still_follows_it():
    """Each leaf holds two groups: their members' best bi-partition crosses the split (the
    two-sided check alone would let the merge through), their best cut into 4 parts lies along
    it and beats group-free rotations: not merged, and the round line says why."""
    from clusterfed.clustering.bipartition import bipartition
    from clusterfed.clustering.reproducible import agreement
    from clusterfed.clustering.split_scores import cosine_similarity_matrix

    rng = np.random.default_rng(3)
    groups = {k: int(k) // 4 for k in KEYS16}
    strategy = make_strategy(CFL, groups, split_timing="evidence", min_split_round=1)
    for server_round in (1, 2):
        run_round(strategy, server_round, {k: E[int(k) // 8] + 0.05 * rng.standard_normal(DIM) for k in KEYS16})
    assert leaves(strategy) == [set(s) for s in SPLIT_OF_FOUR]
    drift_alike(strategy)
    updates = four_groups_alike_across(rng)
    side_a, _ = bipartition(cosine_similarity_matrix(np.stack(list(updates.values()))))
    crossing = np.isin(np.arange(16), side_a).astype(int)
    assert agreement([int(k) // 8 for k in KEYS16], crossing) < 0.8  # the bi-partition crosses the split
    said = run_round(strategy, 3, updates)
    assert said["merges"] == [] and leaves(strategy) == [set(s) for s in SPLIT_OF_FOUR]
    assert ("clusters 1 and 2 not merged: their split still reproduces (ARI 1.00 >= 0.80 on their best cut, "
            "and it beats group-free rotations of the updates") in said["decision"]
    kept = strategy.state.merge_kept[-1]
    assert kept["group_test"]["passes"] and kept["agreement"] == 1.0
    # one task's spread in each leaf instead: the merge rule stands, the leaves merge
    rng = np.random.default_rng(4)
    strategy = make_strategy(CFL, groups, split_timing="evidence", min_split_round=1)
    for server_round in (1, 2):
        run_round(strategy, server_round, {k: E[int(k) // 8] + 0.05 * rng.standard_normal(DIM) for k in KEYS16})
    drift_alike(strategy)
    for server_round in (3, 4):  # alike in two successive rounds: a merge reproduces
        same = {k: 2 * E[5] + E[1] + 0.3 * rng.standard_normal(DIM) for k in KEYS16}
        said = run_round(strategy, server_round, same)
    assert said["merges"] != [] and len(leaves(strategy)) == 1


def test_a_merge_never_undoes_a_split_that_still_reproduces():
    rng = np.random.default_rng(2)
    strategy = make_strategy(CFL, GROUPS, split_timing="evidence", min_split_round=1)
    split_on(strategy, P1, rng)
    drift_alike(strategy)
    said = run_round(strategy, 3, close_sides(rng, P1))
    assert said["merges"] == [] and leaves(strategy) == [set(s) for s in P1]
    assert "clusters 1 and 2 not merged: their split still reproduces (ARI 1.00 >= 0.80)" in said["decision"]
    # the paper's timing keeps the merge rule as it was: the same updates merge the two leaves
    paper = make_strategy(CFL, GROUPS, split_timing="criteria", split_criteria="absolute", eps1=1e6, eps2=1e-6,
                          min_split_round=1)
    split_on(paper, P1, rng)
    drift_alike(paper)
    assert run_round(paper, 3, close_sides(rng, P1))["merges"] != []
    assert len(set(paper.assignment.values())) == 1


def test_a_split_undone_by_a_merge_is_redone_when_the_rounds_agree_again():
    rng = np.random.default_rng(3)
    strategy = make_strategy(CFL, GROUPS, split_timing="evidence", min_split_round=1)
    split_on(strategy, P1, rng)
    drift_alike(strategy)
    # the two leaves' updates became indistinguishable (the split no longer reproduces): the first
    # such round is said and waits, the second merges (a merge reproduces, as a split does)
    said = run_round(strategy, 3, one_direction(rng, noise=0.01))
    assert said["merges"] == [] and len(set(strategy.assignment.values())) == 2
    assert "clusters 1 and 2 alike this round (round cosine 1.00): merged only if they are alike again" in said["decision"]
    said = run_round(strategy, 4, one_direction(rng, noise=0.01))
    assert len(said["merges"]) == 1 and len(set(strategy.assignment.values())) == 1
    assert "merged into 3" in said["decision"]
    # the groups show again, in two rounds that agree: the merged cluster splits again
    run_round(strategy, 5, two_sides(P1, rng))
    assert len(strategy.state.splits) == 1
    run_round(strategy, 6, two_sides(P1, rng))
    assert len(strategy.state.splits) == 2 and strategy.state.splits[1]["parent"] == 3
    assert leaves(strategy) == [set(s) for s in P1]


def test_a_merge_waits_while_the_leaves_are_alike_in_one_round_only():
    """Alike, then not, then alike: never two rounds in a row, never merged."""
    rng = np.random.default_rng(5)
    strategy = make_strategy(CFL, GROUPS, split_timing="evidence", min_split_round=1)
    split_on(strategy, P1, rng)
    drift_alike(strategy)
    for server_round, vectors in ((3, one_direction(rng, noise=0.01)), (4, two_sides(P1, rng)),
                                  (5, one_direction(rng, noise=0.01))):
        assert run_round(strategy, server_round, vectors)["merges"] == []
    assert leaves(strategy) == [set(s) for s in P1] and strategy.state.merge_alike == {"1-2": 5}


def test_round_one_says_what_each_strategy_compares():
    rng = np.random.default_rng(4)
    vectors = two_sides(P1, rng)
    cfl = run_round(make_strategy(CFL, GROUPS, **EVIDENCE), 1, vectors)["decision"]
    assert cfl.startswith("CFL: compares the cosine similarity of the clients' updates of every trained array "
                          "(4: conv1.weight, conv1.bias, fc1.weight, fc1.bias)")
    assert "two successive rounds give the same partition (ARI >= 0.80), from round 2" in cfl
    unknown = run_round(make_strategy(LayerCFL, GROUPS, **EVIDENCE), 1, vectors)["decision"]  # the default skew
    assert unknown.startswith("LayerCFL: compares the clients' updates of every trained array (skew unknown): "
                              "conv1.weight, conv1.bias, fc1.weight, fc1.bias")
    layercfl = make_strategy(LayerCFL, GROUPS, skew="feature", **EVIDENCE)  # a known skew: candidate layers
    said = run_round(layercfl, 1, vectors)["decision"]
    assert said.startswith("LayerCFL: compares candidate layers (conv: conv1.weight, conv1.bias; fc: fc1.weight, "
                           "fc1.bias)")
    said = run_round(layercfl, 2, two_sides(P1, rng))["decision"]
    assert said.startswith("LayerCFL: layer choice: ") and "rounds 1 and 2 agree (ARI 1.00)" in said
    assert layercfl.state.layer_settled and layercfl.state.layer_evidence["agreement"] == 1.0
    # an explicit layer: said as such, no candidates
    fixed = run_round(make_strategy(LayerCFL, GROUPS, cluster_layers="fc1", **EVIDENCE), 1, vectors)["decision"]
    assert fixed.startswith("LayerCFL: compares the clients' updates of the fc1 layer (cluster-layers = fc1): "
                            "fc1.weight, fc1.bias")
    hicfl = run_round(make_strategy(HiCFL, GROUPS, **EVIDENCE), 1, vectors)["decision"]
    assert hicfl.startswith("HiCFL: compares the clients' updates layer by layer (2 layers: conv1, fc1)")
    # round 2 says nothing more about what is compared
    quiet = make_strategy(CFL, GROUPS, split_timing="evidence", min_split_round=9)
    run_round(quiet, 1, vectors)
    assert "compares" not in (run_round(quiet, 2, vectors).get("decision") or "")


def test_a_singleton_cluster_is_named_and_advice_skips_values_in_force():
    from clusterfed.explain.bipartition import cluster_count_basis, one_cluster_advice
    rng = np.random.default_rng(5)
    # the paper's timing splits off one client (on evidence a lone client is not a split)
    strategy = make_strategy(CFL, GROUPS, split_timing="criteria", min_split_round=1)
    split_on(strategy, [KEYS[:11], KEYS[11:]], rng)
    basis = cluster_count_basis(strategy.state, strategy.params)
    assert "cluster 2 is a single client (11)" in basis
    never = make_strategy(CFL, GROUPS, split_timing="criteria", split_criteria="relative", min_split_round=1)
    for server_round in (1, 2):
        run_round(never, server_round, one_direction(rng, noise=0.0))
    advice = one_cluster_advice(never.state, never.params)
    assert "split-criteria = relative" not in advice  # relative is the default, already in force
    assert "split-timing = evidence" in advice


def test_hicfl_splits_on_evidence_before_its_stability_windows_fill():
    """HiCFL (window 5: no window full before round 7) splits once two rounds agree."""
    rng = np.random.default_rng(6)
    strategy = make_strategy(HiCFL, GROUPS, **EVIDENCE)
    said = {}
    for server_round in (1, 2, 3):
        said[server_round] = run_round(strategy, server_round, two_sides(P1 if server_round % 2 else P2, rng))
    assert strategy.state.splits == []
    assert "split of cluster 0 deferred: rounds 2 and 3 disagree (ARI" in said[3]["decision"]
    said[4] = run_round(strategy, 4, two_sides(P1, rng))
    assert leaves(strategy) == [set(s) for s in P1]
    assert "cluster 0 split into 1 and 2 on conv1" in said[4]["decision"] and "rounds 3 and 4 agree" in said[4]["decision"]
    assert not strategy.state.windows_filled


def test_a_member_absent_from_the_split_round_with_no_update_to_compare_is_left_unplaced():
    """Under partial participation a member may sit out every round before its cluster's split,
    or its last update may cover other arrays than the split's (a silent array started training):
    with nothing to compare it joins neither side, leaves the tree and the assignment (it is
    placed by descent when next sampled), where it used to be put on the larger side; a member
    with a comparable update is placed by it, provisionally."""
    from clusterfed.clustering.bipartition import ClusterTree
    from clusterfed.strategies.bipartitioning import BiPartitioningState, BiPartitionTree

    state = BiPartitioningState(tree=ClusterTree(["a", "b", "c", "d"], round=0))
    state.assignment = {k: 0 for k in "abcd"}
    route = {"rule": "mean", "directions": [np.ones(4), -np.ones(4)]}
    last = {"a": -np.ones(4), "b": np.ones(7)}  # b's update was taken over 7 coordinates; c never replied
    extra = BiPartitionTree.place_absent(None, state, 0, ["a", "b", "c"], route, last)
    assert extra == ([], ["a"], ["b", "c"])
    assert state.tree.members(0) == ["a", "d"] and set(state.assignment) == {"a", "d"}
    assert state.provisional == {"a": 0}


# ----------------------------------------------------------------------------- one task, or groups?
# A client's own data repeats from round to round, so its update keeps its own direction: a cut of
# identically distributed clients can reproduce. The default timing takes a split only when the
# cut also beats group-free rotations of the round's updates and its parts point apart (mean
# updates' cosine below merge-min-cosine) in both rounds compared.

def own_directions(rng, common, noise=0.05, rank=3):
    """Identically distributed clients: ``common`` × the task's direction, each client's own
    direction (the same every round: its own data; drawn in a few dimensions, as real updates
    clump: a cut of them passes the fixed silhouette) and fresh noise each round."""
    own = {k: rng.standard_normal(rank) @ E[10:10 + rank] for k in KEYS}
    return lambda: {k: common * E[5] + own[k] + noise * rng.standard_normal(DIM) * np.sqrt(rank / DIM) for k in KEYS}


@pytest.mark.parametrize("cls", [CFL, LayerCFL, HiCFL])
@pytest.mark.parametrize("common", [2.0, 0.0])  # training, and converged (no shared direction left)
def test_identically_distributed_clients_whose_own_data_repeats_stay_one_cluster(cls, common):
    """Their cut reproduces round after round and passes the fixed silhouette, but it does not
    beat rotations of the round's updates (rows that differ only by each client's own data)."""
    rng = np.random.default_rng(0)
    updates = own_directions(rng, common)
    strategy = make_strategy(cls, GROUPS, **EVIDENCE)
    said = [run_round(strategy, server_round, updates()).get("decision") or "" for server_round in range(1, 9)]
    assert strategy.state.splits == [] and len(set(strategy.assignment.values())) == 1
    # 12 clients: the group test judged the cuts, and the lines quote its separation
    assert "its parts are no further apart than group-free rotations'" in " ".join(said)
    assert "group-free rotations" in strategy.one_cluster_reason()
    assert "closest refusal by the group test" in strategy.one_cluster_reason()


def test_a_cut_leaving_one_client_alone_is_not_a_split_on_evidence():
    rng = np.random.default_rng(12)
    vectors = lambda: {k: E[0 if k != "11" else 1] + 0.05 * rng.standard_normal(DIM) for k in KEYS}  # noqa: E731
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    said = [run_round(strategy, server_round, vectors()).get("decision") or "" for server_round in (1, 2, 3)]
    assert strategy.state.splits == []
    assert "cluster 0 not split: its cut leaves one client alone (11), whose own data cannot be told" in said[2]
    assert strategy.one_cluster_reason().endswith("last refusal: round 3, cluster 0: client 11 alone")


@pytest.mark.parametrize("cls", [CFL, LayerCFL, HiCFL])
def test_three_groups_are_recovered_on_evidence(cls):
    """Three groups behind one shared direction: the first reproduced split separates one group
    from the other two, whose child (with this round's partition of its members) splits next."""
    rng = np.random.default_rng(8)
    groups = {k: int(k) % 3 for k in KEYS}

    def updates():
        return {k: 0.5 * E[5] + E[groups[k]] + 0.05 * rng.standard_normal(DIM) for k in KEYS}

    strategy = make_strategy(cls, groups, **EVIDENCE)
    for server_round in range(1, 6):
        run_round(strategy, server_round, updates())
    assert leaves(strategy) == sorted(({k for k in KEYS if groups[k] == g} for g in range(3)),
                                      key=lambda s: min(int(k) for k in s))
    assert all(all(c < 0.6 for c in s["reproduction"]["alike"]) for s in strategy.state.splits)


@pytest.mark.parametrize("cls", [CFL, LayerCFL, HiCFL])
@pytest.mark.parametrize("same_round", [True, False])
def test_a_partition_into_three_that_reproduced_is_taken_in_one_round(cls, same_round):
    """same-round-splits (the default): three groups cut alike in rounds 1 and 2, so round 2
    splits the cluster and, on the same replies, the child holding two groups; off, that child
    waits for round 3."""
    rng = np.random.default_rng(8)
    groups = {k: int(k) % 3 for k in KEYS}

    def updates():
        return {k: 0.5 * E[5] + E[groups[k]] + 0.05 * rng.standard_normal(DIM) for k in KEYS}

    strategy = make_strategy(cls, groups, **EVIDENCE, **{"same-round-splits": same_round})
    run_round(strategy, 1, updates())
    said = run_round(strategy, 2, updates())
    three = sorted(({k for k in KEYS if groups[k] == g} for g in range(3)), key=lambda s: min(int(k) for k in s))
    assert [s["round"] for s in strategy.state.splits] == ([2, 2] if same_round else [2])
    assert len(leaves(strategy)) == (3 if same_round else 2)
    if same_round:
        assert leaves(strategy) == three
        second = strategy.state.splits[1]
        assert second["parent"] in strategy.state.splits[0]["children"]
        assert second["reproduction"]["source"] == "rounds 1 and 2"  # the child against round 1, restricted
        assert f"cluster {second['parent']} split into" in said["decision"]
    run_round(strategy, 3, updates())
    assert leaves(strategy) == three


def test_a_child_no_member_of_which_replied_is_not_judged_in_the_split_round():
    """similarity-pool = members: round 2's cut holds the absent group on a side of its own; its
    child has no replies to judge, the other child splits on its members' replies."""
    rng = np.random.default_rng(3)
    groups = {k: int(k) % 3 for k in KEYS}
    towards = {0: E[0], 1: E[1] + 0.8 * E[3], 2: E[2] + 0.8 * E[3]}

    def updates(keys):
        return {k: towards[groups[k]] + 0.05 * rng.standard_normal(DIM) for k in keys}

    strategy = make_strategy(CFL, groups, **EVIDENCE, **{"similarity-pool": "members"})
    run_round(strategy, 1, updates(KEYS))
    said = run_round(strategy, 2, updates([k for k in KEYS if groups[k] != 0]))
    assert [s["parent"] for s in strategy.state.splits] == [0, 1]
    assert leaves(strategy) == sorted(({k for k in KEYS if groups[k] == g} for g in range(3)),
                                      key=lambda s: min(int(k) for k in s))
    assert said["merges"] == []  # children made this round are not merged this round


def test_an_earlier_rounds_directions_score_a_child_exactly_when_it_holds_whole_parts():
    rows = np.array([[1.0, 0, 0], [1.0, 0.1, 0], [0, 1.0, 0], [0, 1.0, 0.1], [0.6, 0.8, 0], [0.6, 0.8, 0.1]])
    labels = [0, 0, 1, 1, 2, 2]
    pairs = part_cosines(rows @ rows.T, labels)
    assert max(pairs.values()) == pytest.approx(most_alike_sides(rows @ rows.T, labels))
    entry = {"best": dict(zip("abcdef", labels)), "pairs": {"best": pairs}}
    alike, kept = whole_parts_alike(entry, "best", {"c", "d", "e", "f"})  # parts 1 and 2, whole
    inside = rows[2:] @ rows[2:].T
    assert alike == pytest.approx(most_alike_sides(inside, labels[2:])) and list(kept) == ["1-2"]
    assert whole_parts_alike(entry, "best", {"a", "c", "d"}) is None  # part 0 cut through
    assert whole_parts_alike(entry, "best", {"a", "b"})[0] == -1.0  # one part: no two to compare
    assert whole_parts_alike({"best": entry["best"]}, "best", {"c", "d"}) is None  # no pairs kept


def test_a_newcomer_passing_two_splits_of_one_round_trains_once():
    """The splits a round makes share the model they were decided on: a newcomer descending both
    trains on it once, and that update places it at both (its group's leaf)."""
    rng = np.random.default_rng(8)
    groups = {k: int(k) % 3 for k in KEYS}

    def update(group):
        return 0.5 * E[5] + E[group] + 0.05 * rng.standard_normal(DIM)

    strategy = make_strategy(CFL, groups, **EVIDENCE)
    for server_round in (1, 2):
        run_round(strategy, server_round, {k: update(groups[k]) for k in KEYS})
    assert [s["round"] for s in strategy.state.splits] == [2, 2]
    for group in range(3):
        key = f"new{group}"
        hand(strategy).clients[key] = ClientInfo(key, 50, group)
        admission, batches = iter(steps(strategy.admit(round_of(strategy, 3), [key]))), 0
        try:
            asks = next(admission)
            while True:
                batches += 1
                asks = admission.send(Replies([reply_to(ask, arrays_of(update(group))) for ask in asks]))
        except StopIteration:
            pass
        home = next(strategy.assignment[k] for k in KEYS if groups[k] == group)
        assert strategy.assignment[key] == home
        assert batches == 1  # one training, whether it passed one split or two


def test_a_reproduced_split_whose_parts_point_alike_is_refused_and_says_so():
    """The cut is clean and reproduces, but both parts move the task's way (mean updates' cosine
    0.9): the merge rule would undo it, so it is not a split."""
    rng = np.random.default_rng(9)
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    said = {}
    for server_round in (1, 2, 3):
        said[server_round] = run_round(strategy, server_round, two_sides(P1, rng, base=3 * E[5]))
    assert strategy.state.splits == []
    text = said[3]["decision"]
    assert ("cluster 0 not split: rounds 2 and 3 agree (ARI 1.00), but its parts point alike (mean-update cosine "
            "0.9") in text and "0.60 in round 3): one task, each client's own data" in text
    (refused,) = said[3]["refused_splits"]
    assert refused["reason"] == "alike" and refused["agreement"] == 1.0 and min(refused["alike"]) >= 0.6
    reason = strategy.one_cluster_reason()
    assert reason.startswith("every partition that reproduced had parts whose mean updates point alike")
    assert "closest refusal: round " in reason and "but its parts point alike (mean-update cosine 0." in reason


def test_parts_must_point_apart_in_both_rounds_compared():
    """Round 1 its parts point alike (the task's direction dominates), round 2 apart (the task
    converged, what is left is each part's own): the cut reproduces, but round 1 said one task;
    a split waits for two rounds that both point apart."""
    rng = np.random.default_rng(10)
    strategy = make_strategy(CFL, GROUPS, **EVIDENCE)
    run_round(strategy, 1, two_sides(P1, rng, base=3 * E[5]))
    said = run_round(strategy, 2, two_sides(P1, rng))
    assert strategy.state.splits == []
    assert ("rounds 1 and 2 agree (ARI 1.00), but its parts point alike (mean-update cosine 0.9"
            in said["decision"]) and "in round 1): one task" in said["decision"]
    said = run_round(strategy, 3, two_sides(P1, rng))
    assert leaves(strategy) == [set(s) for s in P1]
    assert "rounds 2 and 3 agree (ARI 1.00), parts apart (mean-update cosine" in said["decision"]


def conv_apart_fc_alike(rng, sides, shared=6.0):
    """The two sides apart on conv1 (coordinates 0-79), every client moving one way on fc1
    (coordinates 80-163), by far the most and noisily: on all arrays together the sides look
    alike (mean updates' cosine near 1, members no better separated than noise)."""
    out = {}
    for i, side in enumerate(sides):
        for key in side:
            v = np.zeros(DIM)
            v[i] = 1.0
            v[100] = shared
            v[:80] += 0.02 * rng.standard_normal(80)
            v[80:] += 0.4 * rng.standard_normal(DIM - 80)
            out[key] = v
    return {k: out[k] for k in KEYS}


def test_hicfl_merge_never_undoes_a_split_that_still_reproduces_on_its_own_layer():
    """HiCFL splits on one layer and merges on every array: the merged pair's split is checked
    on the layer it was decided on (conv1), where it still reproduces."""
    rng = np.random.default_rng(11)
    strategy = make_strategy(HiCFL, GROUPS, split_timing="evidence", min_split_round=1)
    split_on(strategy, P1, rng)
    assert strategy.state.splits[0]["layer"] == "conv1"
    drift_alike(strategy)
    said = run_round(strategy, 3, conv_apart_fc_alike(rng, P1))
    assert said["merges"] == [] and leaves(strategy) == [set(s) for s in P1]
    assert "clusters 1 and 2 not merged: their split still reproduces (ARI 1.00 >= 0.80)" in said["decision"]


# partial participation: 40 clients in 2 groups, 10 reply a round, no two rounds share 5 of them
A, B = [f"a{i}" for i in range(20)], [f"b{i}" for i in range(20)]
HALVES = {**{k: 0 for k in A}, **{k: 1 for k in B}}
BLOCKS = [range(0, 5), range(5, 10), range(10, 15), range(15, 20), (0, 1, 5, 6, 10)]  # round 5 meets 1-3 in pairs


@pytest.mark.parametrize("cls", [CFL, HiCFL])
@pytest.mark.parametrize("earlier", ["groups", "another cut", "no structure"])
def test_at_partial_participation_pairs_seen_together_earlier_are_the_evidence(cls, earlier):
    """Rounds 1-4 share fewer than min-split-size clients: deferred, saying so. Round 5 shares at
    most 4 with any earlier round, but 13 pairs of its clients met in rounds 1-3: split when those
    pairs sat as they sit now (the groups), deferred when the earlier rounds cut them otherwise,
    never split without structure."""
    rng = np.random.default_rng(0)
    strategy = make_strategy(cls, HALVES, split_timing="evidence", min_split_round=2, min_split_size=5)

    def direction(key, server_round):
        if earlier == "no structure":
            return E[5]
        if earlier == "another cut" and server_round < 5:
            return E[int(key[1:]) % 2]  # odd against even, across the groups
        return E[HALVES[key]]

    for server_round, block in enumerate(BLOCKS, 1):
        sample = [A[i] for i in block] + [B[i] for i in block]
        said = run_round(strategy, server_round, {k: direction(k, server_round) + 0.05 * rng.standard_normal(DIM)
                                                  for k in sample})["decision"]
        if server_round in (2, 3, 4) and earlier != "no structure":
            assert (f"deferred: rounds {server_round - 1} and {server_round} share fewer than 5 clients, "
                    "nor did 10 pairs of 5 of them meet in earlier rounds") in said
        if server_round < 5:
            assert strategy.state.splits == []
    if earlier == "groups":
        assert "pairs seen together in rounds 1–3 and round 5 agree (pair ARI 1.00 over 13 pairs)" in said
        clusters = set(strategy.assignment.values())
        found = {frozenset(k for k, c in strategy.assignment.items() if c == cluster) for cluster in clusters}
        assert found == {frozenset(A), frozenset(B)}
        assert strategy.state.splits[0]["reproduction"]["pairs"] == 13
    elif earlier == "another cut":
        assert "deferred: pairs seen together in rounds 1–3 and round 5 disagree (pair ARI" in said
        assert strategy.state.splits == []
    else:
        assert strategy.state.splits == []


@pytest.mark.parametrize("cls", [CFL, HiCFL])
def test_a_split_with_no_earlier_round_to_compare_asks_its_repliers_again_beyond_the_sample(cls):
    """ask-again (the default): at partial participation, a split deferred because no earlier
    round shares enough of its repliers, nor pairs of them, asks those repliers again next round,
    and the round line says so; they train beyond the sample, for the split test's evidence only,
    so the sample (the clients averaged) is the one drawn with ask-again off."""
    drawn, said = {}, {}
    for ask_again in (True, False):
        rng = np.random.default_rng(0)
        strategy = make_strategy(cls, HALVES, split_timing="evidence", min_split_round=2, min_split_size=5,
                                 fraction_train=0.5, ask_again=ask_again)
        for server_round, block in enumerate(BLOCKS[:2], 1):
            sample = [A[i] for i in block] + [B[i] for i in block]
            said[ask_again] = run_round(strategy, server_round, {k: E[HALVES[k]] + 0.05 * rng.standard_normal(DIM)
                                                                 for k in sample})["decision"]
        assert set(strategy.state.asked_again) == (set(sample) if ask_again else set())
        rnd = round_of(strategy, 3)
        asked = strategy.draw_sample(rnd)
        drawn[ask_again] = (set(asked), set(asked) - rnd.evidence_only)
        assert strategy.state.asked_again == ()  # asked once: the next deferral asks again
    for ask_again in (True, False):
        assert "deferred: rounds 1 and 2 share fewer than 5 clients" in said[ask_again]
        assert ("its 10 repliers asked again next round" in said[ask_again]) == ask_again
    (asked_on, averaged_on), (asked_off, averaged_off) = drawn[True], drawn[False]
    assert averaged_on == averaged_off == asked_off and len(averaged_off) == 20
    assert asked_on == averaged_off | set(sample) and not set(sample) <= averaged_off


def test_clients_asked_again_are_asked_beyond_the_sample_and_count_towards_the_top_up():
    """The clients asked again that are still active are asked beyond the sample, in the active
    clients' order, one no longer active left out, the sample kept whole; with
    ``split-min-repliers`` they count towards a cluster's number, the rest drawn from its others."""
    from types import SimpleNamespace

    from clusterfed.strategies.resampling import evidence_sample

    active = [str(i) for i in range(10)]
    state = SimpleNamespace(assignment=dict.fromkeys(active, 0), merged=set(), proposals={})
    for need, asked in ((0, 4), (4, 4), (6, 6)):
        params = SimpleNamespace(split_min_repliers=need, fraction_train=0.5, min_split_round=1, min_split_size=3,
                                 seed=0)
        keys = evidence_sample(state, params, 3, active, ["8", "1"], evidence=True, again=["7", "3", "gone"])
        assert len(keys) == asked and {"1", "3", "7", "8"} <= set(keys) and "gone" not in keys
        assert keys == sorted(keys, key=int)


def test_exact_vectors_keep_the_chosen_arrays_part_when_a_choice_narrows_the_comparison():
    """``decision-arrays = evidence`` narrows CFL's comparison to one array: each client's vector
    keeps that array's coordinates (so a member absent from a later split is still placed by its
    evidence); a vector over other arrays is dropped, and so is everything when the choice is not
    among the arrays the vectors hold."""
    from clusterfed.clustering.vectors import restrict_vectors

    shapes = {"a": ((2,), "float32"), "b": ((3,), "float32")}
    vectors = {"x": np.arange(5.0), "y": np.arange(5.0) + 10, "short": np.ones(3)}
    kept = restrict_vectors(vectors, ["a", "b"], ["b"], shapes)
    assert set(kept) == {"x", "y"} and kept["x"].tolist() == [2, 3, 4] and kept["y"].tolist() == [12, 13, 14]
    assert restrict_vectors(vectors, ["a", "b"], ["b", "a"], shapes)["x"].tolist() == [2, 3, 4, 0, 1]
    assert restrict_vectors(vectors, ["a", "b"], ["c"], shapes) == {}


def test_vectors_are_kept_over_the_arrays_left_after_the_silent_ones_leave():
    """An array no client changed in round 1 leaves the comparison before the round's vectors are
    kept: with similarity-decay the next round adds to vectors of the same width (it used to stop
    with a broadcast error), and a member last seen in round 1 still compares."""
    rng = np.random.default_rng(4)
    strategy = make_strategy(CFL, GROUPS, **{**EVIDENCE, "similarity-decay": 0.8, "similarity-pool": "members"})
    for server_round in (1, 2, 3):
        vectors = {}
        for k in KEYS if server_round == 1 else KEYS[1:]:
            v = 0.5 * E[5] + E[GROUPS[k]] + 0.05 * rng.standard_normal(DIM)
            v[72:80] = 0.0  # conv1.bias never changes
            vectors[k] = v
        run_round(strategy, server_round, vectors)
    assert strategy.state.silent == ["conv1.bias"]
    assert {np.size(v) for v in strategy.state.last_vector.values()} == {DIM - 8}
