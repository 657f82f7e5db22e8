"""The recursive bi-partitioning base, what CFL, LayerCFL and HiCFL share: the cluster
tree (client keys, never matrix positions), the split log written to clusters.json, the criteria
bookkeeping and newcomer placement (merging of leaves: ``leaf_merging.py``; update vectors
and records: ``update_vectors.py``). Newcomers descend the tree: at each split they train
once on the model the parent's members had trained from in the split round, upload only
the arrays the split was decided on, and follow the side whose split-round direction their
update resembles (CFL / LayerCFL: the side's mean update, by cosine; HiCFL: the sign of
the cosine with the reference client's update, as in the split itself). Before the first
split that is simply the root.

Partial participation (``fraction-train`` < 1): a split is decided on the members that
replied in its round. A member that did not is put on a side at once — the side its latest
recorded update points to, or the larger side when it has none — so it always holds a
cluster and a model; the placement is *provisional* (``provisional``: client → the split it
missed, recorded under the split's ``absent``). The first round it is sampled again it is
placed for real, before training, exactly as a newcomer descends the tree but starting at
that split: one local training on the split-round model, an upload of the split's arrays,
the side its update points to (and so on down any later splits). It then trains its
final cluster's model in the same round. A placement reply that is lost leaves it where it
is, still provisional.

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
from typing import Any, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering.bipartition import ClusterTree, SplitDecision, split_criteria
from clusterfed.clustering.sketch import in_sketch_space
from clusterfed.models.parameters import silent_names
from clusterfed.strategies.base import ClusteredState, ClusteredStrategy, Steps, StrategyParams
from clusterfed.strategies.count_evidence import CountEvidence
from clusterfed.strategies.exchange import RETURN_UPDATE, Arrays, Diagnostics, SplitCompared, TrainReply, natural
from clusterfed.strategies.leaf_merging import LeafMerging
from clusterfed.strategies.update_vectors import cosine, decision_record, flatten, stack_float64

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


class BiPartitioning(CountEvidence, LeafMerging, ClusteredStrategy):
    """Clusters grown by bi-partitions: tree, split log, criteria, newcomer descent.

    Subclasses implement ``consider_split(round, cluster, replies, decision)``. Cluster ids
    of the tree and of the base's models coincide (root 0, children numbered in order).
    """

    name = "bipartitioning"
    Params = BiPartitioningParams
    State = BiPartitioningState
    timing_code = "criteria"  # the reason code when the timing rule never held
    figures = ("tree", "splits")

    # ------------------------------------------------------------ set-up
    def init_clusters(self) -> None:
        self.tree = ClusterTree([], round=0)
        root = self.new_cluster(self.theta0)
        if root != self.tree.root_id:
            raise RuntimeError(f"the tree's root {self.tree.root_id} and the first cluster {root} must coincide")
        self.compared = self.compared_names()

    def train_instructions(self, server_round: int, key: str) -> dict[str, Any]:
        return {"return": RETURN_UPDATE}

    def draw_sample(self, server_round: int) -> list[str] | None:
        """Placing a provisional member asks it for work: sample before placement."""
        return self.sample_active()

    def before_train(self, server_round: int) -> Steps:
        """Partial participation: the sampled members placed provisionally at a split they
        sat out descend from that split now, as newcomers do (module docstring)."""
        due = {k: self.provisional[k] for k in self.reachable(self.placed()) if k in self.provisional}
        if not due:
            return
        at, path, failed = yield from self.descend(server_round, due)
        moved = []
        for key, leaf in at.items():
            if key in failed:
                continue  # no placement reply: stays where it is, still provisional
            del self.provisional[key]
            old = self.assignment[key]
            if leaf != old:
                self.tree.remove_member(old, key)
                self.tree.add_member(leaf, key)
                self.assignment[key] = leaf
                self.entered(leaf, [key])
            moved.append({"client": key, "from": old, "cluster": leaf, "path": path[key]})
        return {"replaced": moved}

    def entered(self, cluster: int, keys: list[str]) -> None:
        """Strategy state to restart for clients that moved into ``cluster`` (HiCFL: windows)."""

    # ------------------------------------------------------------ storage
    def compact_storage(self) -> bool:
        """Whether per-client vectors are kept compact (``update-storage``): decided once,
        the first time one is kept, from the clients known then."""
        if self.sketched is None:
            mode = self.params.update_storage
            self.sketched = mode == "sketch" or (mode == "auto" and len(self.clients) > self.params.sketch_above)
        return self.sketched

    def storage_record(self) -> dict[str, Any]:
        return {"mode": self.params.update_storage, "sketched": self.sketched,
                **({"sketch_dim": self.params.sketch_dim} if self.sketched else {})}

    # ------------------------------------------------------------ criteria
    def criteria(self, cluster: int, replies: list[TrainReply]) -> SplitDecision:
        """Sattler's criteria on the full updates of the compared arrays (buffers such as
        BatchNorm's counters excluded); keeps the cluster's largest mean-norm."""
        U = stack_float64([flatten(r.update, self.compared, dtype=None) for r in replies])
        c = self.params
        decision = split_criteria(U, [r.num_examples for r in replies], mode=c.split_criteria, eps1=c.eps1,
                                  eps2=c.eps2, rel_eps1=c.rel_eps1, rel_eps2=c.rel_eps2,
                                  max_mean_norm_seen=self.max_mean_norm.get(cluster))
        self.max_mean_norm[cluster] = decision.reference_mean_norm
        return decision

    def may_split(self, server_round: int, cluster: int, replies: list[TrainReply]) -> bool:
        """Size and timing rules: at least ``min-split-size`` members and as many updates
        this round, not before ``min-split-round``; a cluster made by a merge never splits
        again (module docstring)."""
        size = self.params.min_split_size
        return (server_round >= self.params.min_split_round and len(self.tree.members(cluster)) >= size
                and len(replies) >= size and cluster not in self.merged)

    def thresholds(self) -> dict[str, Any]:
        c = self.params
        return {"mode": c.split_criteria, "eps1": c.eps1, "eps2": c.eps2, "rel_eps1": c.rel_eps1,
                "rel_eps2": c.rel_eps2}

    # ------------------------------------------------------------ silent arrays
    def leave_out_silent(self, replies: list[TrainReply]) -> str | None:
        """On the first replies: the compared arrays whose update is zero for every client
        (``parameters.silent_names``) leave ``compared`` for good, and the layer rules pick
        again without them (``compared_changed``). Returns the sentence naming them, once."""
        if self.silent is not None or not replies:
            return None
        silent = silent_names([r.update for r in replies], self.compared, self.theta0)
        kept = [n for n in self.compared if n not in set(silent)]
        self.silent = silent if kept else []  # all silent: nothing trained yet, nothing to judge by
        if not self.silent:
            return None
        self.compared = kept
        self.compared_changed()
        shown = ", ".join(silent[:4]) + (f" and {len(silent) - 4} more" if len(silent) > 4 else "")
        return f"{type(self).__name__}: left out of every comparison, no client changed them: {shown}"

    def compared_changed(self) -> None:
        """``compared`` lost arrays no client changed: what was chosen from it is chosen again."""

    # ------------------------------------------------------------ the round
    def after_train(self, server_round: int, replies: list[TrainReply]) -> Diagnostics:
        silent = self.leave_out_silent(replies)
        by_cluster: dict[int, list[TrainReply]] = defaultdict(list)
        for reply in sorted(replies, key=lambda r: natural(r.key)):  # positions follow key order
            if reply.cluster in self.models and self.tree.node(reply.cluster).is_leaf:
                by_cluster[reply.cluster].append(reply)
        report: dict[str, dict[str, Any]] = {}
        diagnostics: Diagnostics = {"splits": [], "merges": []}
        for cluster in sorted(by_cluster):
            group = by_cluster[cluster]
            self.split_allowed = self.split_allowed or self.may_split(server_round, cluster, group)
            decision = self.criteria(cluster, group)
            report[str(cluster)] = {**decision_record(decision), "replies": len(group)}
            self.last_criteria = {"round": server_round, "cluster": cluster, **decision_record(decision)}
            for key, records in (self.consider_split(server_round, cluster, group, decision) or {}).items():
                diagnostics.setdefault(key, []).extend(records)
        if self.params.merge:
            diagnostics["merges"] = self.merge_leaves(server_round, {c: g for c, g in by_cluster.items()
                                                                     if self.tree.node(c).is_leaf})
        if silent:
            diagnostics["decision"] = silent
        return {**diagnostics, "split_criteria": report, "last_split_round": self.final_clustering_round}

    def consider_split(self, server_round: int, cluster: int, replies: list[TrainReply],
                       decision: SplitDecision) -> Diagnostics | None:
        """Decide whether ``cluster`` splits this round (CFL, LayerCFL, HiCFL); here: never.
        Returns its diagnostics, each a list of records (concatenated over the clusters)."""

    # ------------------------------------------------------------ splitting
    @staticmethod
    def side_of(vector: np.ndarray, route: dict[str, Any]) -> int:
        """0 or 1: the side of a split that an update on ``route["names"]`` belongs to (a
        full update is first mapped by the split's sketch, if it was decided on sketches)."""
        vector = in_sketch_space(vector, route.get("sketch"))
        sims = [cosine(vector, d) for d in route["directions"]]
        if route["rule"] == "reference":  # HiCFL: the reference's side iff cos > 0
            return 0 if sims[0] > 0 else 1
        return int(np.argmax(sims))  # nearest side mean; ties -> side 0

    def place_absent(self, cluster: int, absent: list[str], route: dict[str, Any], last: dict[str, np.ndarray],
                     sizes: tuple[int, int]) -> tuple[list[str], list[str]]:
        """Members of ``cluster`` that did not reply in its split round: provisionally the
        side their latest update points to; with no update on record, the larger side. They
        descend from this split when next sampled (``before_train``); one already
        provisional keeps the earlier split it missed, whose descent passes this one."""
        extra: tuple[list[str], list[str]] = ([], [])
        for key in absent:
            side = (self.side_of(np.asarray(last[key], dtype=np.float64), route) if key in last
                    else (0 if sizes[0] >= sizes[1] else 1))
            extra[side].append(key)
            self.provisional.setdefault(key, cluster)
        return extra

    def apply_split(self, server_round: int, cluster: int, keys_a: list[str], keys_b: list[str],
                    record: dict[str, Any], route: dict[str, Any], compared: SplitCompared) -> dict[str, Any]:
        """Replace leaf ``cluster`` by two children that start from its model; ``compared`` (what
        the split decided on) is reported with the split's records for scoring. Returns its summary."""
        a, b = self.tree.split_by_keys(cluster, keys_a, keys_b, round=server_round)
        model = self.models.pop(cluster)
        made = (self.new_cluster(model, inherit=cluster), self.new_cluster(model, inherit=cluster))
        if made != (a, b):  # the tree and the models number clusters alike
            raise RuntimeError(f"split of {cluster}: tree children {(a, b)} but new clusters {made}")
        for key in keys_a:
            self.assignment[key] = a
        for key in keys_b:
            self.assignment[key] = b
        self.max_mean_norm.pop(cluster, None)
        self.routes[cluster] = route
        self.split_models[cluster] = model
        record = {"round": server_round, "parent": cluster, "children": [a, b], "members": [keys_a, keys_b], **record}
        self.splits.append(record)
        self.final_clustering_round = server_round
        summary = {k: record[k] for k in ("parent", "children", "gap") if k in record}
        compared.records += [record, summary]
        self.reports.append(compared)
        return summary

    # ------------------------------------------------------------ newcomers
    def admit(self, server_round: int, keys: list[str]) -> Steps:
        """Descend the tree: at each split node train once on the split-round model and
        follow the side the update points to (see the module docstring)."""
        at, path, _ = yield from self.descend(server_round, {key: self.tree.root_id for key in keys})
        for key, leaf in at.items():
            self.tree.add_member(leaf, key)
            self.assignment[key] = leaf
            if server_round > 1:
                self.newcomer_log.append({"round": server_round, "client": key, "cluster": leaf, "path": path[key]})

    def descend(self, server_round: int, start: dict[str, int]) -> Steps:
        """From node ``start[key]`` down to a leaf per key: at each split node train once on
        the split-round model and follow the side the update points to. Returns (leaf per
        key, the split nodes passed, the keys whose placement reply was lost at some node:
        those took the larger side there)."""
        at = dict(start)
        path: dict[str, list[int]] = {key: [] for key in start}
        failed: set[str] = set()
        while True:
            waiting: dict[int, list[str]] = defaultdict(list)
            for key, node in at.items():
                while (into := self.tree.node(node).merged_into) is not None:  # merged leaf: no choice to make
                    node = at[key] = into
                if not self.tree.node(node).is_leaf:
                    waiting[node].append(key)
            if not waiting:
                break
            for node, group in waiting.items():
                route = self.routes[node]
                children = self.tree.node(node).children
                sizes = tuple(len(self.tree.node(ch).members) for ch in children)
                replies = yield self.train_asks(
                    server_round, group, models={k: route["model"] for k in group}, phase="placement",
                    extra={"upload": ",".join(route["names"]), "return": RETURN_UPDATE})
                got = {r.key: flatten(r.update, route["names"]) for r in replies}
                for key in group:
                    if key in got:
                        side = self.side_of(got[key], route)
                    else:  # the placement round failed for this client
                        side = 0 if sizes[0] >= sizes[1] else 1
                        failed.add(key)
                    path[key].append(node)
                    at[key] = children[side]
        return at, path, failed

    # ------------------------------------------------------------ outputs
    def cluster_state(self) -> dict[str, Any]:
        return {
            "tree": self.tree.to_dict(),
            "splits": self.splits,
            "final_clustering_round": self.final_clustering_round,
            "criteria": self.thresholds(),
            "merges": self.merges,
            "one_cluster_reason": self.one_cluster_reason(),
            "update_storage": self.storage_record(),
        }


