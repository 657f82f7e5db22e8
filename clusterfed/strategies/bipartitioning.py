"""The recursive bi-partitioning base, what CFL, LayerCFL and HiCFL share: the cluster
tree (client keys, never matrix positions), the split log written to clusters.json, the criteria
bookkeeping and newcomer placement (merging of leaves: ``leaf_merging.py``; update vectors
and records: ``update_vectors.py``). Newcomers, and members that sat out their cluster's split round, find their leaf by replaying
the splits (``tree_descent.py``). What a run says about its cluster count is
``count_evidence.py``'s, merging ``leaf_merging.py``'s: parts each strategy builds once
(``descent``, ``evidence``, ``merging``) over its own state.

Storage (``update-storage``; choice beyond the papers): the vectors kept per client between
rounds (CFL's and LayerCFL's latest or summed update, HiCFL's stability history) are the
exact ones (``exact``, the papers') or compact ones (``sketch``): float32, shortened to
``sketch-dim`` numbers by a seeded linear map (``clustering/sketch.py``; CFL: a count
sketch, which keeps cosines; HiCFL: a sample of each layer's weights, since its weight
selection reads coordinates). ``auto`` keeps them exact for federations of up to
``sketch-above`` clients and compact above, decided once, when the first vector is kept (a
federation that grows past the threshold later stays exact). A split made on sketches
records the map in its route, and a newcomer's upload is mapped the same way before it is
compared.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering.bipartition import ClusterTree, SplitDecision, split_criteria
from clusterfed.models.parameters import silent_names
from clusterfed.strategies.base import ClusteredState, ClusteredStrategy, Steps, StrategyParams
from clusterfed.strategies.count_evidence import CountEvidence
from clusterfed.strategies.exchange import RETURN_UPDATE, Arrays, Diagnostics, SplitCompared, TrainReply, natural
from clusterfed.strategies.leaf_merging import LeafMerging, replier_vectors
from clusterfed.strategies.tree_descent import TreeDescent
from clusterfed.strategies.update_vectors import decision_record, flatten, stack_float64

class BiPartitioningParams(StrategyParams):
    """Split criteria, size/timing rules and merging, shared by CFL, LayerCFL and HiCFL."""

    split_criteria: Literal["relative", "absolute"] = Field(
        "relative", alias="split-criteria",
        description="Sattler's criteria with absolute eps1/eps2, or relative to the cluster's own norms")
    eps1: float = Field(0.4, gt=0, description="absolute: near-stationary below this mean-update norm")
    eps2: float = Field(1.6, gt=0, description="absolute: heterogeneous above this max update norm")
    rel_eps1: float = Field(0.9, alias="rel-eps1", gt=0, le=1, description="relative: stationary below this x peak mean norm")
    rel_eps2: float = Field(3.0, alias="rel-eps2", gt=0, description="relative: heterogeneous above this x mean-update norm")
    split_silhouette_max_k: int = Field(
        6, alias="split-silhouette-max-k", ge=2, le=20,
        description="the structure score is the best silhouette over cuts into 2..k clusters (2: the proposed split's own)")
    min_split_size: int = Field(3, alias="min-split-size", ge=2,
                                description="fewest members (and updates this round) of a cluster that may split")
    min_split_round: int = Field(5, alias="min-split-round", ge=1, description="no split before this round")
    merge: bool = Field(True, description="merge two leaf clusters whose updates became indistinguishable (beyond the papers)")
    merge_min_cosine: float = Field(0.6, alias="merge-min-cosine", ge=-1, le=1,
                                    description="merge only if the cosine of the two clusters' mean updates reaches this")
    merge_max_silhouette: float = Field(0.5, alias="merge-max-silhouette", ge=-1, le=1,
                                        description="... and the silhouette of their members (labelled by cluster) is at most this")
    update_storage: Literal["auto", "exact", "sketch"] = Field(
        "auto", alias="update-storage",
        description="the per-client vectors kept between rounds: exact (the paper's), sketch (float32, "
                    "sketch-dim numbers: a seeded projection), auto = exact up to sketch-above clients, else sketch")
    sketch_dim: int = Field(8192, alias="sketch-dim", ge=16,
                            description="update-storage = sketch: numbers kept per client vector (count sketch)")
    sketch_above: int = Field(1000, alias="sketch-above", ge=0,
                              description="update-storage = auto: sketch when more clients than this are known")


@dataclass
class BiPartitioningState(ClusteredState):
    tree: ClusterTree | None = None
    compared: list[str] = field(default_factory=list)  # the arrays whose updates are compared (compare-arrays)
    splits: list[dict[str, Any]] = field(default_factory=list)
    routes: dict[int, dict[str, Any]] = field(default_factory=dict)  # split node -> how a newcomer picks a side
    max_mean_norm: dict[int, float] = field(default_factory=dict)  # relative criteria: largest mean-norm per cluster
    final_clustering_round: int | None = None
    merges: list[dict[str, Any]] = field(default_factory=list)
    # split node -> the model its children started from: what a merge measures their drift against
    split_models: dict[int, Arrays] = field(default_factory=dict)
    merged: set[int] = field(default_factory=set)  # clusters made by a merge: final, never split again
    split_allowed: bool = False  # whether the size and round rules ever allowed a split
    # arrays no client changed in the first replies (a frozen backbone): left out of every
    # comparison from then on; None until the first replies were seen
    silent: list[str] | None = None
    # members placed on a side of a split they sat out -> that split's node, until they are
    # placed by descent from it when next sampled (module docstring)
    provisional: dict[str, int] = field(default_factory=dict)
    sketched: bool | None = None  # update-storage: compact vectors (decided when the first is kept)
    last_criteria: dict[str, Any] | None = None  # the last cluster's split criteria (round included), for the reason
    merge_refused: dict[str, Any] | None = None  # the last round's closest pair of leaves not merged, for the basis


class BiPartitioning(ClusteredStrategy):
    """Clusters grown by bi-partitions: tree, criteria, split log; newcomers placed by descent
    (``descent``), leaves merged (``merging``), the cluster count explained (``evidence``).

    Subclasses implement ``consider_split(round, cluster, replies, decision)``. Cluster ids
    of the tree and of the base's models coincide (root 0, children numbered in order).
    """

    name = "bipartitioning"
    Params = BiPartitioningParams
    State = BiPartitioningState
    state: BiPartitioningState
    params: BiPartitioningParams
    timing_code = "criteria"  # the reason code when the timing rule never held
    figures = ("tree", "splits")

    # ------------------------------------------------------------ parts
    # built once, on first use; they hold no state of their own (all of it is ``self.state``'s)
    @cached_property
    def descent(self) -> TreeDescent:
        return TreeDescent(self)

    @cached_property
    def merging(self) -> LeafMerging:
        c = self.params
        return LeafMerging(self, min_cosine=c.merge_min_cosine, max_silhouette=c.merge_max_silhouette,
                           min_drift_members=c.min_split_size, names=self.merge_names, vectors=self.merge_vectors,
                           restart=self.entered)

    @cached_property
    def evidence(self) -> CountEvidence:
        return CountEvidence(self, self.params, self.one_cluster_reasons, self.timing_code)

    # ------------------------------------------------------------ set-up
    def init_clusters(self) -> None:
        self.state.tree = ClusterTree([], round=0)
        root = self.new_cluster(self.state.theta0)
        if root != self.state.tree.root_id:
            raise RuntimeError(f"the tree's root {self.state.tree.root_id} and the first cluster {root} must coincide")
        self.state.compared = self.compared_names()

    def train_instructions(self, server_round: int, key: str) -> dict[str, Any]:
        return {"return": RETURN_UPDATE}

    def draw_sample(self, server_round: int) -> list[str] | None:
        """Placing a provisional member asks it for work: sample before placement."""
        return self.sample_active()

    # ------------------------------------------------------------ newcomers
    def admit(self, server_round: int, keys: list[str]) -> Steps:
        """Descend the tree: at each split node train once on the split-round model and
        follow the side the update points to (``tree_descent.py``)."""
        at, path, _ = yield from self.descent.descend(server_round, {key: self.state.tree.root_id for key in keys})
        for key, leaf in at.items():
            self.state.tree.add_member(leaf, key)
            self.state.assignment[key] = leaf
            if server_round > 1:
                self.state.newcomer_log.append({"round": server_round, "client": key, "cluster": leaf,
                                                "path": path[key]})

    def before_train(self, server_round: int) -> Steps:
        """Partial participation: the sampled members placed provisionally at a split they
        sat out descend from that split now, as newcomers do (``tree_descent.py``)."""
        state = self.state
        due = {k: state.provisional[k] for k in self.reachable(self.placed()) if k in state.provisional}
        if not due:
            return
        at, path, failed = yield from self.descent.descend(server_round, due)
        moved = []
        for key, leaf in at.items():
            if key in failed:
                continue  # no placement reply: stays where it is, still provisional
            del state.provisional[key]
            old = state.assignment[key]
            if leaf != old:
                state.tree.remove_member(old, key)
                state.tree.add_member(leaf, key)
                state.assignment[key] = leaf
                self.entered(leaf, [key])
            moved.append({"client": key, "from": old, "cluster": leaf, "path": path[key]})
        return {"replaced": moved}

    def entered(self, cluster: int, keys: list[str]) -> None:
        """Strategy state to restart for clients that moved into ``cluster`` by a merge or a
        provisional member's descent (HiCFL: their stability windows)."""

    # ------------------------------------------------------------ storage
    def compact_storage(self) -> bool:
        """Whether per-client vectors are kept compact (``update-storage``): decided once,
        the first time one is kept, from the clients known then."""
        if self.state.sketched is None:
            mode = self.params.update_storage
            self.state.sketched = mode == "sketch" or (mode == "auto" and len(self.clients) > self.params.sketch_above)
        return self.state.sketched

    def storage_record(self) -> dict[str, Any]:
        return {"mode": self.params.update_storage, "sketched": self.state.sketched,
                **({"sketch_dim": self.params.sketch_dim} if self.state.sketched else {})}

    # ------------------------------------------------------------ criteria
    def criteria(self, cluster: int, replies: list[TrainReply]) -> SplitDecision:
        """Sattler's criteria on the full updates of the compared arrays (buffers such as
        BatchNorm's counters excluded); keeps the cluster's largest mean-norm."""
        U = stack_float64([flatten(r.update, self.state.compared, dtype=None) for r in replies])
        c = self.params
        decision = split_criteria(U, [r.num_examples for r in replies], mode=c.split_criteria, eps1=c.eps1,
                                  eps2=c.eps2, rel_eps1=c.rel_eps1, rel_eps2=c.rel_eps2,
                                  max_mean_norm_seen=self.state.max_mean_norm.get(cluster))
        self.state.max_mean_norm[cluster] = decision.reference_mean_norm
        return decision

    def may_split(self, server_round: int, cluster: int, replies: list[TrainReply]) -> bool:
        """Size and timing rules: at least ``min-split-size`` members and as many updates
        this round, not before ``min-split-round``; a cluster made by a merge never splits
        again (``leaf_merging.py``)."""
        size = self.params.min_split_size
        return (server_round >= self.params.min_split_round and len(self.state.tree.members(cluster)) >= size
                and len(replies) >= size and cluster not in self.state.merged)

    def thresholds(self) -> dict[str, Any]:
        c = self.params
        return {"mode": c.split_criteria, "eps1": c.eps1, "eps2": c.eps2, "rel_eps1": c.rel_eps1,
                "rel_eps2": c.rel_eps2}

    # ------------------------------------------------------------ silent arrays
    def leave_out_silent(self, replies: list[TrainReply]) -> str | None:
        """On the first replies: the compared arrays whose update is zero for every client
        (``parameters.silent_names``) leave ``compared`` for good, and the layer rules pick
        again without them (``compared_changed``). Returns the sentence naming them, once."""
        state = self.state
        if state.silent is not None or not replies:
            return None
        silent = silent_names([r.update for r in replies], state.compared, state.theta0)
        kept = [n for n in state.compared if n not in set(silent)]
        state.silent = silent if kept else []  # all silent: nothing trained yet, nothing to judge by
        if not state.silent:
            return None
        state.compared = kept
        self.compared_changed()
        shown = ", ".join(silent[:4]) + (f" and {len(silent) - 4} more" if len(silent) > 4 else "")
        return f"{type(self).__name__}: left out of every comparison, no client changed them: {shown}"

    def compared_changed(self) -> None:
        """``compared`` lost arrays no client changed: what was chosen from it is chosen again."""

    # ------------------------------------------------------------ the round
    def after_train(self, server_round: int, replies: list[TrainReply]) -> Diagnostics:
        """Per leaf that replied: the criteria, then ``consider_split``; then merging."""
        state = self.state
        silent = self.leave_out_silent(replies)
        by_cluster: dict[int, list[TrainReply]] = defaultdict(list)
        for reply in sorted(replies, key=lambda r: natural(r.key)):  # positions follow key order
            if reply.cluster in state.models and state.tree.node(reply.cluster).is_leaf:
                by_cluster[reply.cluster].append(reply)
        report: dict[str, dict[str, Any]] = {}
        diagnostics: Diagnostics = {"splits": [], "merges": []}
        for cluster in sorted(by_cluster):
            group = by_cluster[cluster]
            state.split_allowed = state.split_allowed or self.may_split(server_round, cluster, group)
            decision = self.criteria(cluster, group)
            report[str(cluster)] = {**decision_record(decision), "replies": len(group)}
            state.last_criteria = {"round": server_round, "cluster": cluster, **decision_record(decision)}
            for key, records in (self.consider_split(server_round, cluster, group, decision) or {}).items():
                diagnostics.setdefault(key, []).extend(records)
        if self.params.merge:
            diagnostics["merges"] = self.merging.merge_leaves(
                server_round, {c: g for c, g in by_cluster.items() if state.tree.node(c).is_leaf})
        if silent:
            diagnostics["decision"] = silent
        return {**diagnostics, "split_criteria": report, "last_split_round": state.final_clustering_round}

    def consider_split(self, server_round: int, cluster: int, replies: list[TrainReply],
                       decision: SplitDecision) -> Diagnostics | None:
        """Decide whether ``cluster`` splits this round (CFL, LayerCFL, HiCFL); here: never.
        Returns its diagnostics, each a list of records (concatenated over the clusters)."""

    def apply_split(self, server_round: int, cluster: int, keys_a: list[str], keys_b: list[str],
                    record: dict[str, Any], route: dict[str, Any], compared: SplitCompared) -> dict[str, Any]:
        """Replace leaf ``cluster`` by two children that start from its model; ``route`` is how
        a newcomer replays the split (``tree_descent.py``); ``compared`` (what the split decided
        on) is reported with the split's records for scoring. Returns its summary."""
        state = self.state
        a, b = state.tree.split_by_keys(cluster, keys_a, keys_b, round=server_round)
        model = state.models.pop(cluster)
        made = (self.new_cluster(model, inherit=cluster), self.new_cluster(model, inherit=cluster))
        if made != (a, b):  # the tree and the models number clusters alike
            raise RuntimeError(f"split of {cluster}: tree children {(a, b)} but new clusters {made}")
        for key in keys_a:
            state.assignment[key] = a
        for key in keys_b:
            state.assignment[key] = b
        state.max_mean_norm.pop(cluster, None)
        state.routes[cluster] = route
        state.split_models[cluster] = model
        record = {"round": server_round, "parent": cluster, "children": [a, b], "members": [keys_a, keys_b], **record}
        state.splits.append(record)
        state.final_clustering_round = server_round
        summary = {k: record[k] for k in ("parent", "children", "gap") if k in record}
        compared.records += [record, summary]
        self.reports.append(compared)
        return summary

    # ------------------------------------------------------------ merging
    def merge_names(self) -> list[str]:
        """The arrays whose updates decide a merge: every compared array (CFL: its decision arrays)."""
        return self.state.compared

    def merge_vectors(self, groups: dict[int, list[TrainReply]], names: list[str]) -> dict[int, np.ndarray]:
        """Per cluster that replied, the vectors a merge compares: its repliers' updates."""
        return replier_vectors(groups, names)

    # ------------------------------------------------------------ outputs
    def refusal_codes(self) -> list[str]:
        """The reason code of every refused split attempt (``one_cluster_reasons``)."""
        return []

    def refusal_numbers(self) -> str | None:
        """The closest refused split against its threshold (CFL, HiCFL say it)."""
        return None

    def timing_numbers(self) -> str | None:
        """The timing rule's numbers in its last round: the split criteria of the last cluster judged."""
        return self.evidence.criteria_numbers()

    def split_score(self, split: dict[str, Any]) -> tuple[str, float, float] | None:
        """A split's structure score, what it had to reach, and the score's name (subclasses)."""
        return None

    def one_cluster_reason(self) -> str | None:
        return self.evidence.one_cluster_reason()

    def one_cluster_advice(self) -> str | None:
        return self.evidence.one_cluster_advice()

    def cluster_count_basis(self) -> str | None:
        return self.evidence.cluster_count_basis()

    def cluster_state(self) -> dict[str, Any]:
        state = self.state
        return {
            "tree": state.tree.to_dict(),
            "splits": state.splits,
            "final_clustering_round": state.final_clustering_round,
            "criteria": self.thresholds(),
            "merges": state.merges,
            "one_cluster_reason": self.one_cluster_reason(),
            "update_storage": self.storage_record(),
        }
