"""Merging of leaf clusters (choice beyond the papers, ``merge = true``), for the
bi-partitioning strategies (CFL, LayerCFL, HiCFL): two leaves whose members' updates became
indistinguishable (``split_rules.merge_pairs``: cosine of the mean updates, silhouette of
the members, cosine of the model drifts since their common split) become one new leaf whose
model is theirs averaged by size; a merged cluster never splits again. It repairs pure
groups split apart."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from clusterfed.clustering.split_rules import merge_pairs, sides_silhouette
from clusterfed.strategies.exchange import TrainReply, weighted_average
from clusterfed.strategies.update_vectors import cosine, flatten


class LeafMerging:
    """The merge step of ``BiPartitioning`` (reads its tree, models, params and state)."""

    def merge_names(self) -> list[str]:
        """The arrays whose updates decide a merge: every compared array (CFL family overrides)."""
        return self.compared

    def merge_leaves(self, server_round: int, groups: dict[int, list[TrainReply]]) -> list[dict[str, Any]]:
        """Merge the leaf pairs ``split_rules.merge_pairs`` finds among the clusters that
        replied this round (module docstring); returns each merge's summary."""
        if len(groups) < 2:
            return []
        names = self.merge_names()
        updates = self.merge_vectors(groups, names)
        pairs = merge_pairs(updates, min_cosine=self.params.merge_min_cosine,
                            max_silhouette=self.params.merge_max_silhouette,
                            drift=lambda a, b: self.drift_cosine(a, b, names),
                            min_drift_members=self.params.min_split_size)
        summaries = []
        for pair in pairs:
            silhouette = None if np.isnan(pair.silhouette) else pair.silhouette  # NaN: a one-member cluster
            drift = None if np.isnan(pair.drift_cosine) else pair.drift_cosine
            summaries.append(self.apply_merge(server_round, pair.a, pair.b,
                                              {"cosine": pair.cosine, "silhouette": silhouette, "drift_cosine": drift}))
        merged = {c for pair in pairs for c in (pair.a, pair.b)}
        self.merge_refused = self.closest_unmerged(server_round, {c: u for c, u in updates.items() if c not in merged},
                                                   names)
        return summaries

    def merge_vectors(self, groups: dict[int, list[TrainReply]], names: list[str]) -> dict[int, np.ndarray]:
        """Per cluster that replied, the vectors a merge compares: its repliers' updates of
        ``names`` (CFL's similarity pool may widen them to every member's stored update)."""
        return {c: np.stack([flatten(r.update, names) for r in g]) for c, g in sorted(groups.items())}

    def closest_unmerged(self, server_round: int, updates: dict[int, np.ndarray], names: list[str]) -> dict | None:
        """The pair of leaves not merged whose mean updates have the largest cosine, with the
        numbers of the merge tests (silhouette only when the cosine passed: it costs a
        cosine matrix of their members), for ``cluster_count_basis``."""
        if len(updates) < 2:
            return None
        means = {c: u.mean(axis=0) for c, u in updates.items()}
        a, b = max(combinations(sorted(means), 2), key=lambda p: cosine(means[p[0]], means[p[1]]))
        record: dict[str, Any] = {"round": server_round, "clusters": [a, b], "cosine": cosine(means[a], means[b])}
        if record["cosine"] >= self.params.merge_min_cosine and min(len(updates[a]), len(updates[b])) >= 2:
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
        node = self.tree.common_ancestor(a, b)
        if node is None or node not in self.split_models:
            return float("nan")
        start = flatten(self.split_models[node], names)
        return cosine(flatten(self.models[a], names) - start, flatten(self.models[b], names) - start)

    def apply_merge(self, server_round: int, a: int, b: int, record: dict[str, Any]) -> dict[str, Any]:
        """Replace leaves ``a`` and ``b`` by one new leaf whose model is theirs averaged by size;
        returns the merge's summary."""
        keys_a, keys_b = self.tree.members(a), self.tree.members(b)
        merged = self.tree.merge(a, b, round=server_round)
        size_a, size_b = (sum(self.clients[k].num_examples if k in self.clients else 1 for k in keys) or 1
                          for keys in (keys_a, keys_b))
        made = self.new_cluster(weighted_average([self.models.pop(a), self.models.pop(b)], [size_a, size_b]))
        if made != merged:  # the tree and the models number clusters alike
            raise RuntimeError(f"merge of {a} and {b}: tree node {merged} but new cluster {made}")
        for key in keys_a + keys_b:
            self.assignment[key] = merged
        self.merged.add(merged)
        for cluster in (a, b):
            self.max_mean_norm.pop(cluster, None)
        record = {"round": server_round, "merged": [a, b], "into": merged, "members": [keys_a, keys_b], **record}
        self.merges.append(record)
        self.final_clustering_round = server_round
        self.after_merge(merged, keys_a + keys_b)
        return {k: record[k] for k in ("merged", "into", "cosine", "silhouette", "drift_cosine") if k in record}

    def after_merge(self, cluster: int, keys: list[str]) -> None:
        """Strategy state to restart for the members of a merged cluster (HiCFL: windows)."""
