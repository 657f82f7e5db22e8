"""Merging of leaf clusters (choice beyond the papers, ``merge = true``), for the
bi-partitioning strategies (CFL, LayerCFL, HiCFL): two leaves whose members' updates became
indistinguishable (``split_rules.merge_pairs``: cosine of the mean updates, silhouette of
the members, cosine of the model drifts since their common split) become one new leaf whose
model is theirs averaged by size; a merged cluster never splits again. It repairs pure
groups split apart."""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any, Protocol

import numpy as np

from clusterfed.clustering.bipartition import ClusterTree
from clusterfed.clustering.split_rules import merge_pairs, sides_silhouette
from clusterfed.strategies.exchange import Arrays, ClientInfo, TrainReply, weighted_average
from clusterfed.strategies.parts import Host, Part
from clusterfed.strategies.update_vectors import cosine, flatten

# per cluster that replied, the vectors a merge compares (rows: clients)
MergeVectors = Callable[[dict[int, list[TrainReply]], list[str]], dict[int, np.ndarray]]


class MergeState(Protocol):
    """The strategy state merging reads (the tree, models, split models) and writes (the
    merged leaf, the assignment, the merge log, the closest pair not merged)."""

    tree: ClusterTree | None
    models: dict[int, Arrays]
    assignment: dict[str, int]
    split_models: dict[int, Arrays]
    merged: set[int]
    merges: list[dict[str, Any]]
    max_mean_norm: dict[int, float]
    final_clustering_round: int | None
    merge_refused: dict[str, Any] | None


class MergeHost(Host[MergeState], Protocol):
    """What merging needs of its strategy beyond its state: its clients' sizes, a new cluster."""

    clients: dict[str, ClientInfo]

    def new_cluster(self, model: Arrays, inherit: int | None = None) -> int: ...


def replier_vectors(groups: dict[int, list[TrainReply]], names: list[str]) -> dict[int, np.ndarray]:
    """Per cluster that replied, its repliers' updates of ``names`` (the default vectors)."""
    return {c: np.stack([flatten(r.update, names) for r in g]) for c, g in sorted(groups.items())}


class LeafMerging(Part[MergeState]):
    """The merge step (module docstring). ``names()``: the arrays whose updates decide a merge;
    ``vectors``: what a merge compares per cluster (CFL's similarity pool may widen it to
    every member's stored update); ``restart(cluster, keys)``: strategy state to restart for
    the members of a merged cluster (HiCFL: their stability windows)."""

    def __init__(self, host: MergeHost, *, min_cosine: float, max_silhouette: float, min_drift_members: int,
                 names: Callable[[], list[str]], vectors: MergeVectors = replier_vectors,
                 restart: Callable[[int, list[str]], None] | None = None) -> None:
        super().__init__(host)
        self.host: MergeHost = host
        self.min_cosine = min_cosine
        self.max_silhouette = max_silhouette
        self.min_drift_members = min_drift_members
        self.names = names
        self.vectors = vectors
        self.restart = restart

    def merge_leaves(self, server_round: int, groups: dict[int, list[TrainReply]]) -> list[dict[str, Any]]:
        """Merge the leaf pairs ``split_rules.merge_pairs`` finds among the clusters that
        replied this round (module docstring); returns each merge's summary."""
        if len(groups) < 2:
            return []
        names = self.names()
        updates = self.vectors(groups, names)
        pairs = merge_pairs(updates, min_cosine=self.min_cosine, max_silhouette=self.max_silhouette,
                            drift=lambda a, b: self.drift_cosine(a, b, names),
                            min_drift_members=self.min_drift_members)
        summaries = []
        for pair in pairs:
            silhouette = None if np.isnan(pair.silhouette) else pair.silhouette  # NaN: a one-member cluster
            drift = None if np.isnan(pair.drift_cosine) else pair.drift_cosine
            summaries.append(self.apply_merge(server_round, pair.a, pair.b,
                                              {"cosine": pair.cosine, "silhouette": silhouette, "drift_cosine": drift}))
        merged = {c for pair in pairs for c in (pair.a, pair.b)}
        self.state.merge_refused = self.closest_unmerged(
            server_round, {c: u for c, u in updates.items() if c not in merged}, names)
        return summaries

    def closest_unmerged(self, server_round: int, updates: dict[int, np.ndarray], names: list[str]) -> dict | None:
        """The pair of leaves not merged whose mean updates have the largest cosine, with the
        numbers of the merge tests (silhouette only when the cosine passed: it costs a
        cosine matrix of their members), for ``cluster_count_basis``."""
        if len(updates) < 2:
            return None
        means = {c: u.mean(axis=0) for c, u in updates.items()}
        a, b = max(combinations(sorted(means), 2), key=lambda p: cosine(means[p[0]], means[p[1]]))
        record: dict[str, Any] = {"round": server_round, "clusters": [a, b], "cosine": cosine(means[a], means[b])}
        if record["cosine"] >= self.min_cosine and min(len(updates[a]), len(updates[b])) >= 2:
            size_a, size_b = len(updates[a]), len(updates[b])
            record["silhouette"] = sides_silhouette(np.vstack([updates[a], updates[b]]), np.arange(size_a),
                                                    np.arange(size_a, size_a + size_b))
        drift = self.drift_cosine(a, b, names)
        record["drift_cosine"] = None if np.isnan(drift) else drift
        return record

    def drift_cosine(self, a: int, b: int, names: list[str]) -> float:
        """Cosine of the two clusters' model drifts since the split that separated them (their
        models minus the model that split's children started from): every round's pull summed,
        where one round's updates of two converged clusters are mostly noise. NaN when they
        share no split (a merged cluster has no parent)."""
        node = self.state.tree.common_ancestor(a, b)
        if node is None or node not in self.state.split_models:
            return float("nan")
        start = flatten(self.state.split_models[node], names)
        models = self.state.models
        return cosine(flatten(models[a], names) - start, flatten(models[b], names) - start)

    def apply_merge(self, server_round: int, a: int, b: int, record: dict[str, Any]) -> dict[str, Any]:
        """Replace leaves ``a`` and ``b`` by one new leaf whose model is theirs averaged by size;
        returns the merge's summary."""
        state, clients = self.state, self.host.clients
        keys_a, keys_b = state.tree.members(a), state.tree.members(b)
        merged = state.tree.merge(a, b, round=server_round)
        size_a, size_b = (sum(clients[k].num_examples if k in clients else 1 for k in keys) or 1
                          for keys in (keys_a, keys_b))
        made = self.host.new_cluster(weighted_average([state.models.pop(a), state.models.pop(b)], [size_a, size_b]))
        if made != merged:  # the tree and the models number clusters alike
            raise RuntimeError(f"merge of {a} and {b}: tree node {merged} but new cluster {made}")
        for key in keys_a + keys_b:
            state.assignment[key] = merged
        state.merged.add(merged)
        for cluster in (a, b):
            state.max_mean_norm.pop(cluster, None)
        record = {"round": server_round, "merged": [a, b], "into": merged, "members": [keys_a, keys_b], **record}
        state.merges.append(record)
        state.final_clustering_round = server_round
        if self.restart is not None:
            self.restart(merged, keys_a + keys_b)
        return {k: record[k] for k in ("merged", "into", "cosine", "silhouette", "drift_cosine") if k in record}
