"""Cosine similarity, complete-linkage bi-partition, Gap, split criteria, positions -> keys."""

import json

import numpy as np
import pytest

from clusterfed.clustering.bipartition import ClusterTree, bipartition, split_criteria, split_members
from clusterfed.clustering.split_scores import (
    best_cut_silhouette,
    cosine_similarity_matrix,
    separation_gap,
    split_silhouette,
)

# --------------------------------------------------------------------------- similarity


def test_cosine_similarity_known_values():
    U = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [-1.0, 0.0]])
    S = cosine_similarity_matrix(U)
    r = 1 / np.sqrt(2)
    expected = np.array(
        [
            [1, 0, r, -1],
            [0, 1, r, 0],
            [r, r, 1, -r],
            [-1, 0, -r, 1],
        ]
    )
    np.testing.assert_allclose(S, expected, atol=1e-12)


def test_cosine_similarity_zero_rows_no_nan():
    U = np.array([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    S = cosine_similarity_matrix(U)
    assert np.all(np.isfinite(S))
    np.testing.assert_array_equal(np.diag(S), [1.0, 1.0, 1.0])
    assert S[0, 1] == S[1, 0] == S[1, 2] == S[0, 2] == 0.0


# --------------------------------------------------------------------------- bipartition


def test_bipartition_two_clear_groups():
    rng = np.random.default_rng(0)
    up, right = np.array([0.0, 1.0, 0, 0]), np.array([1.0, 0.0, 0, 0])
    rows = [up, right, up, right, right, up]
    U = np.array([r + 0.01 * rng.standard_normal(4) for r in rows])
    a, b = bipartition(cosine_similarity_matrix(U))
    assert a.tolist() == [0, 2, 5]  # side a holds position 0
    assert b.tolist() == [1, 3, 4]


def test_bipartition_two_clients_and_ties_never_empty():
    a, b = bipartition(np.array([[1.0, 0.2], [0.2, 1.0]]))
    assert (a.tolist(), b.tolist()) == ([0], [1])
    # identical updates: every distance is 0, the dendrogram is all ties
    S = cosine_similarity_matrix(np.ones((5, 3)))
    a, b = bipartition(S)
    assert a.size > 0 and b.size > 0
    assert sorted(a.tolist() + b.tolist()) == list(range(5))


def test_bipartition_needs_two_clients():
    with pytest.raises(ValueError):
        bipartition(np.ones((1, 1)))


# --------------------------------------------------------------------------- gap


def test_separation_gap_hand_example():
    S = np.array(
        [
            [1.0, 0.9, 0.1, 0.0],
            [0.9, 1.0, 0.2, 0.3],
            [0.1, 0.2, 1.0, 0.8],
            [0.0, 0.3, 0.8, 1.0],
        ]
    )
    # intra min = min(0.9, 0.8) = 0.8, cross max = 0.3
    assert separation_gap(S, [0, 1], [2, 3]) == pytest.approx(0.5)
    # a wrong split has a negative gap: intra min 0.0 (0-3), cross max 0.9 (0-1)
    assert separation_gap(S, [0, 3], [1, 2]) == pytest.approx(-0.9)


def test_separation_gap_singletons():
    S = np.array([[1.0, 0.7, -0.2], [0.7, 1.0, 0.1], [-0.2, 0.1, 1.0]])
    # side {2} has no intra pair: intra min comes from {0,1} only
    assert separation_gap(S, [0, 1], [2]) == pytest.approx(0.7 - 0.1)
    # two singletons: intra min is the diagonal 1
    assert separation_gap(S[:2, :2], [0], [1]) == pytest.approx(1 - 0.7)


def test_split_silhouette_hand_example():
    # two tight pairs, orthogonal to each other: distances 0 inside, 1 across -> silhouette 1
    U = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    S = cosine_similarity_matrix(U)
    assert split_silhouette(S, [0, 1], [2, 3]) == pytest.approx(1.0)
    # the same vectors cut across the pairs: every member is closer to the other side
    assert split_silhouette(S, [0, 2], [1, 3]) == pytest.approx(-0.5)  # a = 1, b = (0 + 1)/2
    # a member alone on its side scores 0 (sklearn's convention)
    sil = split_silhouette(S, [0], [1, 2, 3])
    assert -1.0 <= sil < 0.5
    with pytest.raises(ValueError):
        split_silhouette(S, [0, 1], [2])  # not a partition


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_silhouette_low_for_noise_high_for_two_groups(seed):
    rng = np.random.default_rng(seed)
    m, d = 16, 400
    common = rng.standard_normal(d)
    # noise around a shared direction (IID clients): whatever bipartition complete linkage
    # proposes, the silhouette stays low, at any scale of the shared part
    for scale in (0.0, 1.0, 10.0):
        U = scale * common + rng.standard_normal((m, d))
        S = cosine_similarity_matrix(U)
        assert split_silhouette(S, *bipartition(S)) < 0.1
    # the same noise plus two group directions: the proposed split is the groups, silhouette high
    groups = np.repeat([0, 1], m // 2)
    directions = 3 * rng.standard_normal((2, d))
    U = common + directions[groups] + 0.5 * rng.standard_normal((m, d))
    S = cosine_similarity_matrix(U)
    side_a, side_b = bipartition(S)
    assert {tuple(groups[side_a]), tuple(groups[side_b])} == {(0,) * 8, (1,) * 8}
    assert split_silhouette(S, side_a, side_b) > 0.6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_cut_silhouette_sees_four_groups_where_the_two_way_split_looks_weak(seed):
    rng = np.random.default_rng(seed)
    m, d = 20, 400
    groups = np.repeat(np.arange(4), m // 4)
    # four group directions, pairwise orthogonal-ish: any 2-way split puts two groups per side
    directions = 3 * rng.standard_normal((4, d))
    U = directions[groups] + 3.0 * rng.standard_normal((m, d))
    S = cosine_similarity_matrix(U)
    two_way = split_silhouette(S, *bipartition(S))
    score, k = best_cut_silhouette(S, 6)
    assert k == 4
    assert two_way < 0.3 < 0.4 < score  # refused at 0.3 as a 2-way split, accepted by the best cut
    assert best_cut_silhouette(S, 2)[0] == pytest.approx(two_way)
    # noise around a shared direction: no cut into 2..6 clusters scores well
    noise = rng.standard_normal(d) + rng.standard_normal((m, d))
    assert best_cut_silhouette(cosine_similarity_matrix(noise), 6)[0] < 0.15


def test_best_cut_silhouette_small_clusters():
    S = cosine_similarity_matrix(np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert best_cut_silhouette(S, 6) == (0.0, 1)  # two members: nothing to score
    S3 = cosine_similarity_matrix(np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]]))
    score, k = best_cut_silhouette(S3, 6)
    assert k == 2 and score > 0.5  # only m - 1 = 2 clusters can be scored


# --------------------------------------------------------------------------- split criteria


def _opposed_updates(scale):
    """Two groups pushing opposite ways: the mean update nearly cancels."""
    v = np.array([1.0, 0.0, 0.0])
    w = np.array([0.0, 0.05, 0.0])
    return scale * np.array([v + w, v - w, -v + w, -v - w * 0.5])


def test_absolute_criteria_fire_on_large_opposed_updates():
    U = _opposed_updates(2.0)
    d = split_criteria(U, [1, 1, 1, 1], mode="absolute")
    assert d.mean_norm < 0.4 and d.max_norm > 1.6
    assert d.stationary and d.heterogeneous and d.split


def test_relative_fires_where_absolute_does_not_on_small_norms():
    U = _opposed_updates(0.01)  # max norm 0.01: eps2 = 1.6 can never fire
    weights = [10, 10, 10, 10]
    absolute = split_criteria(U, weights, mode="absolute")
    assert absolute.stationary and not absolute.heterogeneous and not absolute.split
    # earlier the cluster moved together with mean norm 0.01
    relative = split_criteria(U, weights, mode="relative", max_mean_norm_seen=0.01)
    assert relative.stationary and relative.heterogeneous and relative.split
    assert relative.reference_mean_norm == pytest.approx(0.01)


def test_relative_not_stationary_in_first_round_and_not_heterogeneous_when_agreeing():
    U = _opposed_updates(0.01)
    first = split_criteria(U, [1, 1, 1, 1])  # nothing seen yet: reference = current
    assert first.heterogeneous and not first.stationary and not first.split
    same = np.tile([0.003, 0.004, 0.0], (4, 1))  # all agree: norm 0.005 each
    d = split_criteria(same, [1, 2, 3, 4], max_mean_norm_seen=1.0)
    assert d.mean_norm == pytest.approx(0.005)
    assert d.max_norm == pytest.approx(0.005)
    assert d.stationary and not d.heterogeneous and not d.split


def test_mean_norm_is_weighted_norm_of_mean():
    U = np.array([[1.0, 0.0], [-1.0, 0.0]])
    d = split_criteria(U, [3, 1], mode="absolute")
    assert d.mean_norm == pytest.approx(0.5)  # ||0.75 e1 - 0.25 e1||
    assert d.max_norm == pytest.approx(1.0)
    with pytest.raises(ValueError):
        split_criteria(U, [1, 1], mode="bogus")
    with pytest.raises(ValueError):
        split_criteria(U, [1, 1, 1])


def test_single_update_never_splits():
    d = split_criteria(np.array([[5.0, 0.0]]), [1], mode="absolute", eps1=10, eps2=1)
    assert d.stationary and d.heterogeneous and not d.split


# --------------------------------------------------------------------------- positions -> keys


def test_split_members_maps_positions_to_keys():
    keys = ["c7", "c2", "c9"]
    assert split_members(keys, [2, 0], [1]) == (["c9", "c7"], ["c2"])
    with pytest.raises(ValueError):
        split_members(keys, [0], [1])  # position 2 lost
    with pytest.raises(ValueError):
        split_members(keys, [0, 1], [1, 2])  # position 1 twice
    with pytest.raises(ValueError):
        split_members(keys, [0, 1, 2], [])  # empty side


def _nested_updates(keys):
    """8 clients: 2 super-groups × 2 groups × 2 clients, nested similarities.

    Each vector = e_super + e_group + 0.5 e_client over distinct orthonormal axes, so
    cos = 2/2.25 within a group, 1/2.25 within a super-group, 0 across super-groups.
    """
    super_of = {f"c{i}": i // 4 for i in range(8)}
    group_of = {f"c{i}": i // 2 for i in range(8)}
    client_of = {f"c{i}": i for i in range(8)}
    E = np.eye(2 + 4 + 8)
    return np.array(
        [E[super_of[k]] + E[2 + group_of[k]] + 0.5 * E[6 + client_of[k]] for k in keys]
    )


def test_three_level_hierarchy_maps_to_keys_not_positions():
    keys = ["c5", "c2", "c7", "c0", "c3", "c6", "c1", "c4"]  # shuffled on purpose
    index = {k: i for i, k in enumerate(keys)}
    U = _nested_updates(keys)
    S_all = cosine_similarity_matrix(U)
    tree = ClusterTree(keys, round=0)

    def split_leaf(cluster_id, round_):
        members = tree.members(cluster_id)
        rows = [index[k] for k in members]
        S = S_all[np.ix_(rows, rows)]  # sub-matrix: positions are member positions
        a, b = bipartition(S)
        gap = separation_gap(S, a, b)
        return tree.split(cluster_id, a, b, round=round_, gap=gap), gap

    (left, right), gap1 = split_leaf(tree.root_id, 3)
    assert gap1 == pytest.approx(1 / 2.25)
    sides = {frozenset(tree.members(left)), frozenset(tree.members(right))}
    assert sides == {frozenset({"c0", "c1", "c2", "c3"}), frozenset({"c4", "c5", "c6", "c7"})}

    level2 = []
    for child in (left, right):
        (ga, gb), gap2 = split_leaf(child, 5)
        assert gap2 == pytest.approx(1 / 2.25)
        level2 += [ga, gb]
    assert {frozenset(tree.members(c)) for c in level2} == {
        frozenset({"c0", "c1"}),
        frozenset({"c2", "c3"}),
        frozenset({"c4", "c5"}),
        frozenset({"c6", "c7"}),
    }

    level3 = []
    for grandchild in level2:
        (sa, sb), gap3 = split_leaf(grandchild, 9)
        assert gap3 == pytest.approx(1 - 2 / 2.25)
        level3 += [sa, sb]
    assert {tuple(tree.members(c)) for c in level3} == {(f"c{i}",) for i in range(8)}

    assert sorted(tree.leaves()) == sorted(level3)
    assignment = tree.assignment()
    assert set(assignment) == set(keys)
    for cid in level3:
        (key,) = tree.members(cid)
        assert assignment[key] == cid
        node = tree.node(cid)
        assert node.depth == 3
        # the parent pair holds this key and the key of its group partner
        partner = f"c{int(key[1:]) ^ 1}"
        assert set(tree.members(node.parent)) == {key, partner}

    # JSON round trip, with the info passed at each split
    data = json.loads(json.dumps(tree.to_dict()))
    assert data["root"] == 0 and len(data["nodes"]) == 1 + 2 + 4 + 8
    root = data["nodes"][0]
    assert root["split_info"]["round"] == 3 and root["children"] == [left, right]
    assert root["info"] == {"round": 0}
    rebuilt = ClusterTree.from_dict(data)
    assert rebuilt.assignment() == assignment
    assert [rebuilt.members(c) for c in level3] == [tree.members(c) for c in level3]


def test_cluster_tree_rules():
    tree = ClusterTree(["a", "b", "c", "d"])
    x, y = tree.split(0, [1, 3], [0, 2])
    assert tree.members(x) == ["b", "d"] and tree.members(y) == ["a", "c"]
    with pytest.raises(ValueError):
        tree.split(0, [0], [1, 2, 3])  # already split
    # positions refer to the child's own member list
    p, q = tree.split(x, [1], [0])
    assert tree.members(p) == ["d"] and tree.members(q) == ["b"]
    r, s = tree.split_by_keys(y, ["c"], ["a"], round=7)
    assert tree.members(r) == ["c"] and tree.node(r).info == {"round": 7}
    tree.add_member(s, "e")
    assert tree.assignment()["e"] == s
    with pytest.raises(ValueError):
        tree.add_member(p, "e")
    with pytest.raises(ValueError):
        ClusterTree(["a", "a"])
    # the split both descend from: their nearest common ancestor; a merged node has none
    assert tree.common_ancestor(p, q) == x and tree.common_ancestor(p, r) == 0 and tree.common_ancestor(p, x) == x
    merged = tree.merge(p, q)
    assert tree.common_ancestor(merged, r) is None
    rebuilt = ClusterTree.from_dict(json.loads(json.dumps(tree.to_dict())))
    t1, t2 = rebuilt.split(s, [0], [1])
    assert t1 == max(tree.leaves()) + 1  # ids keep counting after a restore
