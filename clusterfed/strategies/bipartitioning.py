"""The bi-partition tree CFL, LayerCFL and HiCFL share: an object, not a base class. It keeps
the cluster tree and the split log in the strategy's ``State``, judges every leaf that replied
by Sattler's criteria (CFL's Algorithm 1: ``‖mean Δ‖ < ε1`` and ``max ‖Δ‖ > ε2``) under the
size and timing rules, and hands the split to the algorithm's decision, a function it is built
with — ``decide(tree, state, server_round, cluster, replies, criteria, clients, reports)`` —
which proposes, tests and, to split, calls ``tree.apply_split``. It also merges leaves (beyond
the papers, ``merge``), leaves out the arrays no client changed, and places clients by replaying
splits. With ``split-timing = evidence`` (the default) the criteria are recorded, not waited for:
a split is taken when this round's partition of the cluster's repliers reproduces an earlier
round's (``reproduce``, ``clustering/reproducible.py``) and its parts point apart in both rounds
(``Evidence``: the clients of one task keep their own data's direction, so a cut of them can
reproduce, but its parts still point the task's way), a split's children inherit that
partition; a merge, too, is taken when two successive rounds find the leaves alike, and never
undoes a split that still shows (``merge_evidence.py``). It never calls its strategy: every
method gets the ``state`` (and the clients, the reports list) as arguments; what differs is
given at construction as functions of the state.

Descent: newcomers, and members that sat out their cluster's split round (placed at once on
the side their latest update points to, ``provisional``; with none, unplaced), train once at each split on its
split-round model, upload the split's arrays and follow the side their update resembles. A
split's ``routes[node]`` is what the descent replays (``rule``, ``names``, ``directions``,
``model``, optionally ``sketch`` and HiCFL's ``centre``). Storage (``update-storage``): the
vectors kept per client are exact (the papers') or compact (``sketch``, ``clustering/sketch.py``);
``auto`` is exact up to ``sketch-above`` clients, decided once, when the first vector is kept.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering.bipartition import ClusterTree, SplitDecision, bipartition, split_criteria
from clusterfed.clustering.reproducible import DEFAULT_AGREEMENT, compare, too_few_pairs
from clusterfed.clustering.split_evidence import KINDS, Evidence, pair_evidence, whole_parts_alike
from clusterfed.clustering.split_scores import best_cut_labels, cosine_similarity_matrix
from clusterfed.clustering.sketch import in_sketch_space
from clusterfed.clustering.split_rules import largest_cosine, match_pairs, merge_pairs, part_cosines
from clusterfed.clustering.vectors import closest_unmerged, cosine, decision_record, flatten, side_of, stack_float64
from clusterfed.models.parameters import silent_names
from clusterfed.strategies.base import ClusteredState, StrategyParams
from clusterfed.strategies.merge_evidence import reproduced_merges, still_split
from clusterfed.core.exchange import (RETURN_UPDATE, Arrays, ClientInfo, Diagnostics, SplitCompared, TrainReply,
    natural, weighted_average)

def same_arrays(a: Arrays, b: Arrays) -> bool:
    """Whether two models hold the same arrays (the one object, or equal values)."""
    return a is b or (a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a))


def best_evidence(found: list[Evidence], bound: float, min_cosine: float) -> Evidence:
    """The partition that passes (reproduces, parts apart in both rounds), else the best agreement."""
    return max(found, key=lambda e: (e.passes(bound, min_cosine), e.reproduction.reproduces(bound), e.agreement))


class BiPartitioningParams(StrategyParams):
    """Split criteria, size/timing rules and merging, shared by CFL, LayerCFL and HiCFL."""

    split_timing: Literal["evidence", "criteria"] = Field(
        "evidence", alias="split-timing",
        description="evidence (beyond the papers, the default): every round from min-split-round a cluster's split is "
                    "proposed and taken only when its cut beats group-free rotations of the round's updates, two "
                    "successive rounds' updates give the same partition of its clients (ARI >= split-agreement) and "
                    "its parts' mean updates point apart in both rounds (cosine below merge-min-cosine); a merge only "
                    "when two successive rounds find the leaves alike and their updates no longer reproduce their "
                    "split; criteria: the paper's timing rule "
                    "(CFL: Sattler's criteria, HiCFL: model stability) decides when (the paper's presets)")
    split_agreement: float = Field(
        DEFAULT_AGREEMENT, alias="split-agreement", ge=-1, le=1,
        description="split-timing = evidence: the agreement (adjusted Rand index) two successive rounds' partitions "
                    "must reach for a split, and that keeps two leaves from merging")

    same_round_splits: bool = Field(
        True, alias="same-round-splits",
        description="split-timing = evidence: a split's children are judged again in the round they are made, on "
                    "their members' replies against the earlier rounds' partitions restricted to them, so that a "
                    "partition into k parts that reproduced is taken in one round (false: a child waits for the next "
                    "round, one split per cluster and round)")

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
    ask_again: bool = Field(
        True, alias="ask-again",
        description="split-timing = evidence at fraction-train < 1 (beyond the papers): a split that passed every "
                    "test but could not be compared with an earlier round (too few of its repliers met before) "
                    "has its repliers asked again in the next round, beyond its sample, for the split test's "
                    "evidence only")
    split_min_repliers: int = Field(
        8, alias="split-min-repliers", ge=0,
        description="split-timing = evidence at fraction-train < 1 (beyond the papers): from the round before "
                    "min-split-round, each cluster that may split is asked at least this many of its active members "
                    "a round (all of them when fewer), beyond the fraction-train sample, its last partition's clients "
                    "first, so that a split is judged on the evidence of enough clients in two rounds; their updates "
                    "serve the split test only, the cluster averages its sample (0 = the sample only)")
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
    # split-timing = evidence: cluster -> its last partitions (newest last, PROPOSALS_KEPT), each
    # {"round", "best": {client: label}, "two": {client: side}}; a split's children inherit theirs
    proposals: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    merge_kept: list[dict[str, Any]] = field(default_factory=list)  # merges refused or waiting (merge_evidence.py)
    merge_alike: dict[str, int] = field(default_factory=dict)  # "a-b" -> the last round leaves a and b were alike
    # the timing this run started with (``init``: split-timing); a checkpoint written before the
    # field existed resumes with the timing it ran with, the criteria
    split_timing: str = "criteria"
    said_compared: bool = True  # round 1's line named what the strategy compares (``init``: False)
    # ask-again: the repliers of the splits deferred this round for want of an earlier round to compare
    asked_again: tuple[str, ...] = ()


PROPOSALS_KEPT = 6  # partitions kept per cluster: partial participation compares with the latest sharing enough clients
MIN_COMMON = 4  # clients two rounds' partitions must share to be compared


def compared_arrays(state: BiPartitioningState) -> list[str]:
    """The arrays whose updates decide a merge by default: every compared array."""
    return state.compared


def replier_vectors(state: BiPartitioningState, groups: dict[int, list[TrainReply]],
                    names: list[str]) -> dict[int, np.ndarray]:
    """Per cluster that replied, its repliers' updates of ``names`` (the default merge vectors)."""
    return {c: np.stack([flatten(r.update, names) for r in g]) for c, g in sorted(groups.items())}


def add_cluster(state: ClusteredState, model: Arrays, inherit: int | None = None) -> int:
    """The base's ``new_cluster`` on ``state``: a cluster from ``model`` (``inherit``: its optimiser state)."""
    cluster = state.next_cluster_id
    state.next_cluster_id += 1
    state.models[cluster] = {k: v.copy() for k, v in model.items()}
    if inherit is not None and inherit in state.aggregator_state:
        state.aggregator_state[cluster] = copy.deepcopy(state.aggregator_state[inherit])
    return cluster


class BiPartitionTree:
    """The shared tree (module docstring): ``decide``, the split decision; ``merge_names(state)``,
    ``merge_vectors(state, groups, names)``: what a merge compares; ``restart(state, cluster, keys)``:
    what restarts for clients that entered ``cluster`` by a merge or a descent."""

    def __init__(self, params: BiPartitioningParams, decide: Callable[..., Diagnostics | None], *,
                 merge_names: Callable[[Any], list[str]] = compared_arrays,
                 merge_vectors: Callable[..., dict[int, np.ndarray]] = replier_vectors,
                 restart: Callable[[Any, int, list[str]], None] | None = None) -> None:
        self.params, self.decide, self.restart = params, decide, restart
        self.merge_names, self.merge_vectors = merge_names, merge_vectors

    # ------------------------------------------------------------ set-up
    def init(self, state: BiPartitioningState, compared: list[str]) -> None:
        """One cluster, the root, holding every client; ``compared``: the arrays compared."""
        state.tree = ClusterTree([], round=0)
        root = add_cluster(state, state.theta0)
        if root != state.tree.root_id:
            raise RuntimeError(f"the tree's root {state.tree.root_id} and the first cluster {root} must coincide")
        state.compared = compared
        state.split_timing = self.params.split_timing
        state.said_compared = False

    # ------------------------------------------------------------ newcomers
    def admit(self, state: BiPartitioningState, server_round: int, keys: list[str]) -> Any:
        """Descend the tree from the root (requests: ``placements``)."""
        at, path, failed = yield from self.descend(state, {key: state.tree.root_id for key in keys})
        for key, leaf in at.items():
            if key in failed:  # its placement reply was lost: unplaced until next sampled
                continue
            state.tree.add_member(leaf, key)
            state.assignment[key] = leaf
            if server_round > 1:
                state.newcomer_log.append({"round": server_round, "client": key, "cluster": leaf, "path": path[key]})

    def place_provisional(self, state: BiPartitioningState, sampled: list[str]) -> Any:
        """The ``sampled`` members placed provisionally at a split they sat out descend from that
        split now, as newcomers do; returns the moves (None when none was due)."""
        due = {k: state.provisional[k] for k in sampled if k in state.provisional}
        if not due:
            return None
        at, path, failed = yield from self.descend(state, due)
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
                if self.restart is not None:
                    self.restart(state, leaf, [key])
            moved.append({"client": key, "from": old, "cluster": leaf, "path": path[key]})
        return {"replaced": moved}

    def descend(self, state: BiPartitioningState, start: dict[str, int]) -> Any:
        """From node ``start[key]`` down to a leaf: at each split a request ``(keys, split-round model,
        extra)``, then the side the update points to. Returns (leaf, nodes passed, keys whose reply was
        lost: they stop there, asked no further)."""
        tree = state.tree
        at = dict(start)
        path: dict[str, list[int]] = {key: [] for key in start}
        failed: set[str] = set()
        trained: dict[str, tuple[Arrays, Arrays]] = {}  # key -> (the model it trained from, its update)
        while True:
            waiting: dict[int, list[str]] = defaultdict(list)
            for key, node in at.items():
                while (into := tree.node(node).merged_into) is not None:  # merged leaf: no choice to make
                    node = at[key] = into
                if not tree.node(node).is_leaf and key not in failed:
                    waiting[node].append(key)
            if not waiting:
                break
            for node, group in waiting.items():
                route = state.routes[node]
                children = tree.node(node).children
                # same-round splits share their model: an update already trained from it serves again
                again = {key: trained[key][1] for key in group if key in trained
                         and same_arrays(trained[key][0], route["model"]) and set(route["names"]) <= set(trained[key][1])}
                ask = [key for key in group if key not in again]
                replies = (yield ask, route["model"], {"upload": ",".join(route["names"]), "return": RETURN_UPDATE}
                           ) if ask else []
                trained.update({r.key: (route["model"], r.update) for r in replies})
                got = {key: flatten(update, route["names"]) for key, update in again.items()}
                got.update({r.key: flatten(r.update, route["names"]) for r in replies})
                for key in group:
                    if key not in got:  # the placement round failed for this client: it stops here
                        failed.add(key)
                        continue
                    path[key].append(node)
                    at[key] = children[side_of(got[key], route)]
        return at, path, failed

    def place_absent(self, state: BiPartitioningState, cluster: int, absent: list[str], route: dict[str, Any],
                     last: dict[str, np.ndarray]) -> tuple[list[str], list[str], list[str]]:
        """Members absent from the split round: provisionally the side their ``last`` update points to
        (one already provisional keeps the earlier split it missed). One with no update to compare (it
        never replied, or over other arrays) joins neither side, where a guess would claim a cluster
        without evidence: it leaves the tree and descends from the root when next sampled."""
        extra: tuple[list[str], list[str], list[str]] = ([], [], [])  # side a, side b, unplaced
        width = len(route["directions"][0])
        for key in absent:
            vector = np.asarray(last[key], dtype=np.float64) if key in last else None
            if vector is not None and in_sketch_space(vector, route.get("sketch")).shape[-1] != width:
                vector = None  # taken over other arrays than the split's
            if vector is None:
                extra[2].append(key)
                state.tree.remove_member(cluster, key)
                del state.assignment[key]
                state.provisional.pop(key, None)
            else:
                extra[side_of(vector, route)].append(key)
                state.provisional.setdefault(key, cluster)
        return extra

    # ------------------------------------------------------------ storage
    def compact(self, state: BiPartitioningState, clients: dict[str, ClientInfo]) -> bool:
        """Whether per-client vectors are kept compact (``update-storage``), decided once, when first asked."""
        if state.sketched is None:
            mode = self.params.update_storage
            state.sketched = mode == "sketch" or (mode == "auto" and len(clients) > self.params.sketch_above)
        return state.sketched

    def storage_record(self, state: BiPartitioningState) -> dict[str, Any]:
        return {"mode": self.params.update_storage, "sketched": state.sketched,
                **({"sketch_dim": self.params.sketch_dim} if state.sketched else {})}

    # ------------------------------------------------------------ criteria
    def criteria(self, state: BiPartitioningState, cluster: int, replies: list[TrainReply]) -> SplitDecision:
        """Sattler's criteria on the full updates of the compared arrays; keeps the largest mean-norm."""
        U = stack_float64([flatten(r.update, state.compared, dtype=None) for r in replies])
        c = self.params
        decision = split_criteria(U, [r.num_examples for r in replies], mode=c.split_criteria, eps1=c.eps1,
                                  eps2=c.eps2, rel_eps1=c.rel_eps1, rel_eps2=c.rel_eps2,
                                  max_mean_norm_seen=state.max_mean_norm.get(cluster))
        state.max_mean_norm[cluster] = decision.reference_mean_norm
        return decision

    def may_split(self, state: BiPartitioningState, server_round: int, cluster: int, replies: list[TrainReply]) -> bool:
        """At least ``min-split-size`` members and replies, not before ``min-split-round``, not a merged leaf."""
        size = self.params.min_split_size
        return (server_round >= self.params.min_split_round and len(state.tree.members(cluster)) >= size
                and len(replies) >= size and cluster not in state.merged)

    # ------------------------------------------------------------ evidence (split-timing = evidence)
    def evidence(self, state: BiPartitioningState) -> bool:
        """Whether this run splits on evidence (``split-timing``, as the run started)."""
        return state.split_timing == "evidence"

    def reproduce(self, state: BiPartitioningState, server_round: int, cluster: int, keys: list[str],
                  U: np.ndarray, whole: np.ndarray | None = None) -> Evidence | str:
        """This round's partition of ``keys`` (rows of ``U``, this round's own updates: independent
        SGD draws from the earlier rounds') kept for ``cluster``, and compared with its latest earlier
        partition sharing at least ``MIN_COMMON`` clients (at partial participation, where none does,
        with the pairs of them last seen together, ``pair_evidence``): the best-silhouette cut (2..split-silhouette-max-k)
        and the bi-partition, each with how alike its parts point (``Evidence``; on ``whole``, the
        clients' updates of every compared array when ``U`` holds fewer: whether two parts train one
        task is the whole model's question, and a layer chosen for separating the clients is not the
        place to ask it); the one that passes (reproduces, parts apart in both rounds), else the best
        agreement. A string when nothing can be compared."""
        U = np.asarray(U, dtype=np.float64)
        S = cosine_similarity_matrix(U)
        best = best_cut_labels(S, self.params.split_silhouette_max_k)
        side_a, _ = bipartition(S) if len(keys) >= 2 else (np.arange(len(keys)), None)
        two = np.isin(np.arange(len(keys)), side_a, invert=True).astype(int)
        W = U if whole is None else np.asarray(whole, dtype=np.float64)
        gram = W @ W.T
        pairs = {"best": part_cosines(gram, best), "two": part_cosines(gram, two)}
        now = {"round": server_round, "best": {k: int(v) for k, v in zip(keys, best)},
               "two": {k: int(v) for k, v in zip(keys, two)},
               "alike": {kind: largest_cosine(of) for kind, of in pairs.items()}, "pairs": pairs,
               "gram": gram}  # this round only: a split's children take their parts' directions from it
        history = [{k: v for k, v in p.items() if k != "gram"}
                   for p in state.proposals.get(cluster, []) if p["round"] < server_round]
        state.proposals[cluster] = (history + [now])[-PROPOSALS_KEPT:]
        if not history:
            return "no earlier round to compare"
        need = max(MIN_COMMON, min(self.params.min_split_size, len(keys)))
        bound, min_cosine = self.params.split_agreement, self.params.merge_min_cosine
        for earlier in reversed(history):
            common = [k for k in keys if k in earlier["best"]]
            if len(common) >= need:
                source = f"rounds {earlier['round']} and {server_round}"
                rounds = (earlier["round"], server_round)
                found = [Evidence(compare([earlier[kind][k] for k in common], [now[kind][k] for k in common], source),
                                  ((earlier.get("alike") or {}).get(kind), now["alike"][kind]), rounds)
                         for kind in KINDS]
                return best_evidence(found, bound, min_cosine)
        # partial participation: no earlier round shares enough of them, but pairs of them met earlier
        found = [e for e in (pair_evidence(history, now, keys, kind, need) for kind in KINDS) if e is not None]
        if found:
            return best_evidence(found, bound, min_cosine)
        return (f"rounds {history[-1]['round']} and {server_round} share fewer than {need} clients, "
                f"{too_few_pairs(need)}")

    def ask_again(self, state: BiPartitioningState, keys: list[str]) -> str:
        """``ask-again``, on a split deferred because no earlier round could be compared: its
        repliers ``keys`` are asked again next round, beyond the sample, for the split test's
        evidence only; the words saying so ('' when off)."""
        if not (self.params.ask_again and self.params.fraction_train < 1 and keys):
            return ""
        state.asked_again = tuple(dict.fromkeys([*state.asked_again, *keys]))
        return f"; its {len(keys)} repliers asked again next round"

    def inherit(self, state: BiPartitioningState, cluster: int, children: tuple[int, int],
                sides: tuple[list[str], list[str]]) -> None:
        """A split's children start with this round's partition of their own members (the evidence
        a child's next round is compared with), and how alike its parts point among them; with
        ``same-round-splits`` the earlier rounds' partitions too (what a child judged in the split's
        round is compared with), how alike their parts pointed known only where the child holds
        whole parts of them (``whole_parts_alike``)."""
        latest = state.proposals.pop(cluster, [])
        for child, keys in zip(children, sides):
            entries = []
            for entry in latest if self.params.same_round_splits else latest[-1:]:
                kept = [k for k in keys if k in entry["best"]]
                if not kept:
                    continue
                mine = {"round": entry["round"], **{kind: {k: entry[kind][k] for k in kept} for kind in KINDS}}
                if entry.get("gram") is not None:  # this round's: the directions among the child's own members
                    order = {k: i for i, k in enumerate(entry["best"])}
                    at = [order[k] for k in kept]
                    mine["pairs"] = {kind: part_cosines(entry["gram"][np.ix_(at, at)], [entry[kind][k] for k in kept])
                                     for kind in KINDS}
                    mine["alike"] = {kind: largest_cosine(mine["pairs"][kind]) for kind in KINDS}
                else:  # an earlier round's: exact where the child holds whole parts of its partition
                    scored = {kind: whole_parts_alike(entry, kind, set(keys)) for kind in KINDS}
                    mine["alike"] = {kind: None if got is None else got[0] for kind, got in scored.items()}
                    mine["pairs"] = {kind: got[1] for kind, got in scored.items() if got is not None}
                entries.append(mine)
            if entries:
                state.proposals[child] = entries

    def forget_grams(self, state: BiPartitioningState) -> None:
        """The round's Gram matrices served this round's splits; none is kept between rounds."""
        for entries in state.proposals.values():
            for entry in entries:
                entry.pop("gram", None)

    def thresholds(self) -> dict[str, Any]:
        c = self.params
        return {"mode": c.split_criteria, "eps1": c.eps1, "eps2": c.eps2, "rel_eps1": c.rel_eps1, "rel_eps2": c.rel_eps2}

    # ------------------------------------------------------------ silent arrays
    def leave_out_silent(self, state: BiPartitioningState, replies: list[TrainReply], name: str) -> str | None:
        """On the first replies: the compared arrays no client changed leave ``compared`` for good;
        the sentence naming them, once (the strategy then chooses again what it chose from them)."""
        if state.silent is not None or not replies:
            return None
        silent = silent_names([r.update for r in replies], state.compared, state.theta0)
        kept = [n for n in state.compared if n not in set(silent)]
        state.silent = silent if kept else []  # all silent: nothing trained yet, nothing to judge by
        if not state.silent:
            return None
        state.compared = kept
        shown = ", ".join(silent[:4]) + (f" and {len(silent) - 4} more" if len(silent) > 4 else "")
        return f"{name}: left out of every comparison, no client changed them: {shown}"

    # ------------------------------------------------------------ the round
    def after_train(self, state: BiPartitioningState, server_round: int, replies: list[TrainReply],
                    clients: dict[str, ClientInfo], reports: list[Any], silent: str | None = None, *,
                    name: str = "", intro: str | None = None) -> Diagnostics:
        """Per leaf that replied: the criteria, then the algorithm's decision; then merging. The
        round's words (``decision``): ``silent``, then ``name: intro; what each decision said``."""
        by_cluster: dict[int, list[TrainReply]] = defaultdict(list)
        for reply in sorted(replies, key=lambda r: natural(r.key)):  # positions follow key order
            if reply.cluster in state.models and state.tree.node(reply.cluster).is_leaf:
                by_cluster[reply.cluster].append(reply)
        report: dict[str, dict[str, Any]] = {}
        diagnostics: Diagnostics = {"splits": [], "merges": []}
        pending, made = sorted(by_cluster), set()
        while pending:
            cluster = pending.pop(0)
            group = by_cluster[cluster]
            state.split_allowed = state.split_allowed or self.may_split(state, server_round, cluster, group)
            decision = self.criteria(state, cluster, group)
            report[str(cluster)] = {**decision_record(decision), "replies": len(group)}
            state.last_criteria = {"round": server_round, "cluster": cluster, **decision_record(decision)}
            found = self.decide(self, state, server_round, cluster, group, decision, clients, reports) or {}
            for key, records in found.items():
                diagnostics.setdefault(key, []).extend(records)
            if self.params.same_round_splits and self.evidence(state):  # the children, judged this round too
                for child in (c for split in found.get("splits", []) for c in split.get("children", [])):
                    made.add(child)
                    replied = [r for r in group if state.assignment.get(r.key) == child]
                    if replied:
                        by_cluster[child] = replied
                        pending.append(child)
        words = diagnostics.pop("words", [])
        if self.params.merge:
            kept = len(state.merge_kept)
            diagnostics["merges"] = self.merge_leaves(
                state, server_round, {c: g for c, g in by_cluster.items() if state.tree.node(c).is_leaf and c not in made},
                clients)
            words += [m["words"] for m in state.merge_kept[kept:]]
            words += [f"clusters {m['merged'][0]} and {m['merged'][1]} merged into {m['into']} (round cosine "
                      f"{m['cosine']:.2f})" for m in diagnostics["merges"]]
        words = ([intro] if intro else []) + words
        self.forget_grams(state)
        said = "; ".join(([silent] if silent else []) + ([f"{name}: " + "; ".join(words)] if words else []))
        if said:
            diagnostics["decision"] = said
        return {**diagnostics, "split_criteria": report, "last_split_round": state.final_clustering_round}

    def apply_split(self, state: BiPartitioningState, server_round: int, cluster: int, keys_a: list[str],
                    keys_b: list[str], record: dict[str, Any], route: dict[str, Any], compared: SplitCompared,
                    reports: list[Any]) -> dict[str, Any]:
        """Leaf ``cluster`` becomes two children starting from its model; ``route``: how a newcomer
        replays the split; ``compared`` goes to ``reports`` with the split's records, for scoring."""
        a, b = state.tree.split_by_keys(cluster, keys_a, keys_b, round=server_round)
        model = state.models.pop(cluster)
        made = (add_cluster(state, model, inherit=cluster), add_cluster(state, model, inherit=cluster))
        if made != (a, b):  # the tree and the models number clusters alike
            raise RuntimeError(f"split of {cluster}: tree children {(a, b)} but new clusters {made}")
        state.assignment.update({key: a for key in keys_a} | {key: b for key in keys_b})
        state.max_mean_norm.pop(cluster, None)
        state.routes[cluster] = route
        state.split_models[cluster] = model
        self.inherit(state, cluster, (a, b), (keys_a, keys_b))
        record = {"round": server_round, "parent": cluster, "children": [a, b], "members": [keys_a, keys_b], **record}
        state.splits.append(record)
        state.final_clustering_round = server_round
        summary = {k: record[k] for k in ("parent", "children", "gap") if k in record}
        compared.records += [record, summary]
        reports.append(compared)
        return summary

    # ------------------------------------------------------------ merging (beyond the papers)
    def merge_leaves(self, state: BiPartitioningState, server_round: int, groups: dict[int, list[TrainReply]],
                     clients: dict[str, ClientInfo]) -> list[dict[str, Any]]:
        """Merge the leaf pairs ``split_rules.merge_pairs`` finds among the clusters that replied (cosine
        of the mean updates, silhouette of the members, cosine of the drifts since their common split)."""
        if len(groups) < 2:
            return []
        names = self.merge_names(state)
        updates = self.merge_vectors(state, groups, names)
        c = self.params
        evidence = self.evidence(state)
        pairs = merge_pairs(updates, min_cosine=c.merge_min_cosine, max_silhouette=c.merge_max_silhouette,
                            drift=lambda a, b: self.drift_cosine(state, a, b, names), min_drift_members=c.min_split_size,
                            match=not evidence)
        if evidence:  # a merge, like a split, reproduces; it never undoes a split that still shows
            pairs = [p for p in pairs if not still_split(state, c, server_round, p.a, p.b, updates, groups)]
            pairs = match_pairs(reproduced_merges(state, server_round, pairs, list(updates)))
        summaries = []
        for pair in pairs:
            silhouette = None if np.isnan(pair.silhouette) else pair.silhouette  # NaN: a one-member cluster
            drift = None if np.isnan(pair.drift_cosine) else pair.drift_cosine
            summaries.append(self.apply_merge(state, server_round, pair.a, pair.b, clients,
                                              {"cosine": pair.cosine, "silhouette": silhouette, "drift_cosine": drift}))
        merged = {c for pair in pairs for c in (pair.a, pair.b)}
        state.merge_refused = closest_unmerged(server_round, {c: u for c, u in updates.items() if c not in merged},
                                               self.params.merge_min_cosine,
                                               lambda a, b: self.drift_cosine(state, a, b, names))
        return summaries

    def drift_cosine(self, state: BiPartitioningState, a: int, b: int, names: list[str]) -> float:
        """Cosine of the clusters' model drifts since the split that separated them (NaN: none)."""
        node = state.tree.common_ancestor(a, b)
        if node is None or node not in state.split_models:
            return float("nan")
        start = flatten(state.split_models[node], names)
        return cosine(flatten(state.models[a], names) - start, flatten(state.models[b], names) - start)

    def apply_merge(self, state: BiPartitioningState, server_round: int, a: int, b: int,
                    clients: dict[str, ClientInfo], record: dict[str, Any]) -> dict[str, Any]:
        """Replace leaves ``a`` and ``b`` by one new leaf whose model is theirs averaged by size."""
        keys_a, keys_b = state.tree.members(a), state.tree.members(b)
        merged = state.tree.merge(a, b, round=server_round)
        size_a, size_b = (sum(clients[k].num_examples if k in clients else 1 for k in keys) or 1
                          for keys in (keys_a, keys_b))
        made = add_cluster(state, weighted_average([state.models.pop(a), state.models.pop(b)], [size_a, size_b]))
        if made != merged:  # the tree and the models number clusters alike
            raise RuntimeError(f"merge of {a} and {b}: tree node {merged} but new cluster {made}")
        for key in keys_a + keys_b:
            state.assignment[key] = merged
        if not self.evidence(state):  # the paper's timing: a merged leaf is final; on evidence it may split again
            state.merged.add(merged)
        for cluster in (a, b):
            state.max_mean_norm.pop(cluster, None)
        record = {"round": server_round, "merged": [a, b], "into": merged, "members": [keys_a, keys_b], **record}
        state.merges.append(record)
        state.final_clustering_round = server_round
        if self.restart is not None:
            self.restart(state, merged, keys_a + keys_b)
        return {k: record[k] for k in ("merged", "into", "cosine", "silhouette", "drift_cosine") if k in record}

    # ------------------------------------------------------------ outputs
    def cluster_state(self, state: BiPartitioningState, thresholds: dict[str, Any],
                      one_cluster_reason: str | None) -> dict[str, Any]:
        return {"tree": state.tree.to_dict(), "splits": state.splits, "final_clustering_round": state.final_clustering_round,
                "criteria": thresholds, "merges": state.merges, "one_cluster_reason": one_cluster_reason,
                "update_storage": self.storage_record(state)}
