"""The driver's scoring of what a strategy reports: true-group diagnostics the strategy
itself never computes (it never sees true groups)."""

import numpy as np

from clusterfed.results import with_true_groups
from clusterfed.runner.scoring import score_reports
from clusterfed.core.exchange import ClientInfo, NewcomersPlaced, SplitCompared


def clients(groups: dict[str, int]) -> dict[str, ClientInfo]:
    return {k: ClientInfo(k, 10, g) for k, g in groups.items()}


def test_a_split_gets_the_gap_of_the_true_groups_on_the_matrix_it_decided_on():
    S = np.array([[1.0, 0.8, 0.1, 0.3],
                  [0.8, 1.0, 0.2, 0.0],
                  [0.1, 0.2, 1.0, 0.9],
                  [0.3, 0.0, 0.9, 1.0]])
    record, summary = {"gap": 0.5}, {"parent": 0}
    score_reports([SplitCompared(["a", "b", "c", "d"], S, [record, summary])],
                  clients({"a": 0, "b": 0, "c": 1, "d": 1}), {})
    assert record["true_group_gap"] == summary["true_group_gap"] == np.float64(0.8 - 0.3)
    one_group = {"gap": 0.5}
    score_reports([SplitCompared(["a", "b"], S[:2, :2], [one_group])], clients({"a": 0, "b": 0}), {})
    assert one_group["true_group_gap"] is None  # no cross pair: undefined


def test_newcomers_match_the_majority_group_of_their_cluster_when_placed():
    groups = clients({"a": 0, "b": 0, "c": 1, "n1": 0, "n2": 1, "n3": 2, "n4": 2, "n5": 0})
    before = {"a": 0, "b": 0, "c": 0}  # cluster 0: group 0 holds the majority
    entries = [{"client": "n1", "cluster": 0, "new_cluster": False},  # group 0 into group 0's cluster
               {"client": "n2", "cluster": 0, "new_cluster": False},  # group 1 into group 0's cluster
               {"client": "n3", "cluster": 1, "new_cluster": True},   # founds a cluster: group 2 had none
               {"client": "n4", "cluster": 1, "new_cluster": False},  # joins the founder's group
               {"client": "n5", "cluster": 2, "new_cluster": True}]   # founds one for a group that has one
    score_reports([NewcomersPlaced(entries)], groups, before)
    assert [(e["true_group"], e["matches_true_group"]) for e in entries] == [
        (0, True), (1, False), (2, True), (2, True), (0, False)]


def test_clusters_json_gets_the_true_groups_after_the_assignment():
    clusters = with_true_groups({"strategy": "x", "assignment": {"a": 0, "b": 1}, "sizes": {}}, {"a": 3, "b": 4, "z": 5})
    assert list(clusters) == ["strategy", "assignment", "true_groups", "sizes"]
    assert clusters["true_groups"] == {"a": 3, "b": 4}
    given = {"assignment": {"a": 0}, "true_groups": {"a": 9}}
    assert with_true_groups(given, {"a": 3}) is given  # a record that says them itself keeps them
