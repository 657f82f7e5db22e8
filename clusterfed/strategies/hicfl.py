"""HiCFL (Gong, Xing, Liu, Xi, Chen, "Towards Hierarchical Clustered Federated Learning With
Model Stability on Mobile Devices", IEEE Transactions on Mobile Computing 2023). The paper's
steps, in the order ``after_train`` and ``decide`` run them (the shared tree,
``bipartitioning.py``, keeps the cluster tree and calls ``decide`` for every cluster that replied):

1. All clients start in one cluster; every round each member sends its full update
   (``return = update``); the server aggregates per cluster.
2. **Model stability** per client and layer: ``S_t = |(T_t + T_{t−1})/2 − T_{t−2~t}|`` from the
   last three updates of that layer, averaged over a window of W rounds (``window``; counted
   once full; ``hicfl_stability.py``). A layer is a named layer of the state dict, weight and
   bias together (a recurrent layer's input and hidden weights each a layer with its bias:
   ``models.layers.weight_unit_of``); ``cluster-layers`` restricts the layers watched (buffers never are).
3. **Weight selection**: when a client enters a cluster only the indexes with
   ``|Δ_new − Δ_old| > ξ`` of each layer are kept for its stability (``xi``, the paper's
   ``0.05·η``); stability starts one round later. The share of weights kept is reported.
4. **Split timing**: a cluster is ready when, on one layer, the windowed stability of every
   member is below ε (``stability-eps``; the paper's ``0.5·η`` is ``lr``).
5. **The split**: reference ``c_r = argmin S`` on the ready layer; members whose update has
   ``cos > 0`` with the reference's join its side (``split = reference``); never an empty
   side. Children start from the parent's model; their members' windows restart.
6. **Stop rule**: a cluster whose updates agree (the heterogeneity half of CFL's criteria,
   ``split-criteria``, fails in the split round) stops splitting.

Beyond the paper, each a ``Params`` field listed with the paper's rule, our default and the
``PAPER`` preset in docs/algorithms/hicfl.md: ε relative to each layer's scale, the median
member's timing, the weight selection's fallback (``min-kept-fraction``), complete linkage
(``split = linkage``), centred updates, the structure test and layer choice instead of the stop
rule (``min-silhouette``), ``min-side``, the small-side rotation test, merging.

Partial participation (``fraction-train`` < 1): stability runs over each client's own
participations; the repliers with full windows (at least ``min-split-size``) vote and propose;
a replier whose window is not full joins the side its update points to (``unwindowed``); a
member that did not reply is placed at once by its last update (``absent``) and by descent
when next sampled (docs/algorithms/hicfl.md). As in CFL: ``min-split-size`` and
``min-split-round``. Each split records the rule, layer, ready layers and scores, reference,
stabilities, criteria, Gap and the layer's cosine matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from clusterfed.strategies import array_choice, base
from clusterfed.clustering.null_reference import DEFAULT_DRAWS
from clusterfed.clustering.bipartition import SplitDecision
from clusterfed.clustering.layer_split import EVIDENCE_DRAWS, SMALL_SIDE_RANK, EvidenceTest
from clusterfed.clustering.split_rules import pick_best, ready_layers
from clusterfed.clustering.split_scores import separation_gap
from clusterfed.clustering.stability import StabilityTracker
from clusterfed.clustering.vectors import decision_record, side_of, similarity_record
from clusterfed.explain import bipartition as explain
from clusterfed.strategies import hicfl_stability as windows
from clusterfed.strategies.base import ClusteredStrategy, StrategyParamsError
from clusterfed.strategies.bipartitioning import BiPartitioningParams, BiPartitioningState, BiPartitionTree, Evidence
from clusterfed.strategies.tree_hooks import tree_admit, tree_before_train, tree_draw_sample, tree_train_instructions
from clusterfed.core.exchange import ClientInfo, Diagnostics, Round, SplitCompared, TrainReply

# The small-side rotation test's level, as the largest of this many draws (read from more:
# layer_split.small_side_reference): the test is repeated every round while a cluster
# stays whole, so a 5 % test (19 draws) is passed by noise within a few rounds (measured on
# Sattler's timing: a 2 | 2 cut of one group at 0.816 against 0.809 after seven refusals); 99
# draws: 1 %. On evidence, at most 19 in a cluster too small for two sides of min-split-size
# (layer_split.small_cluster_draws).
SMALL_SIDE_DRAWS = 99

PositiveNumber = Annotated[float, Field(gt=0)]


class HiCFLParams(BiPartitioningParams):
    cluster_layers: str = Field("auto", alias="cluster-layers",
                                description="layers whose stability is watched: a rule or names; auto = every layer of compared arrays")
    window: int = Field(5, ge=1, description="W: rounds the windowed stability averages over")
    stability_eps: PositiveNumber | Literal["auto", "lr"] = Field(
        "auto", alias="stability-eps",
        description='absolute ε (the paper\'s mode), "lr" = the paper\'s 0.5 × the train config\'s lr, or "auto" = '
                    'relative to each layer\'s scale (stability-eps-rel)')
    stability_eps_rel: float = Field(
        1.5, alias="stability-eps-rel", gt=0,
        description="ε as a multiple of each layer's median windowed stability at the cluster's first full window")
    xi: PositiveNumber | Literal["auto"] = Field(
        "auto", description='ξ of the weight selection, or "auto" = 0.05 × the train config\'s lr')
    timing: Literal["all", "median"] = Field(
        "median", json_schema_extra={"legacy": "hicfl-timing"}, description="a layer is ready when every member (the paper) / the median member is below ε")
    split: Literal["reference", "linkage"] = Field(
        "linkage", json_schema_extra={"legacy": "hicfl-split"}, description="sign of the cosine with the reference (the paper) or complete linkage (CFL's)")
    # CFL's bar: higher bars refused true groups just under them behind the rotation test and two
    # rounds' agreement; 0.30 split an IID control until the best layer's rotation test shared
    # its level among the layers scored (benchmarks/results/model-fuzz/dev-hicfl-shared-level)
    min_silhouette: float = Field(0.30, alias="min-silhouette", json_schema_extra={"legacy": "hicfl-min-silhouette"}, ge=-1, le=1,
                                  description="structure test on the proposed split; -1 = off (the paper's stop rule)")
    # measured on digits (rotation, seed 0) before the fallback: one client kept 1 of conv1's
    # 160 weights, its S was identically 0 and it became the reference of a 19 | 1 split
    min_kept_fraction: float = Field(
        0.05, alias="min-kept-fraction", ge=0, le=1,
        description="a ξ-selection keeping fewer than this share of a layer's weights falls back to the whole layer "
                    "(0 = never; beyond the paper)")
    centre_updates: bool = Field(
        True, alias="centre-updates",
        description="split = reference: cosines with the reference on updates minus the members' weighted mean "
                    "(false = the paper's raw updates)")
    min_side: int = Field(2, alias="min-side", json_schema_extra={"legacy": "hicfl-min-side"}, ge=1, description="fewest members on each side of a split")
    small_side_reference_draws: int = Field(
        SMALL_SIDE_DRAWS, alias="small-side-reference-draws", ge=0,
        description="a linkage split leaving a side of 2 to min-split-size - 1 members must also beat group-free "
                    "rotations of the members' updates in best-cut silhouette at the level of the largest of this "
                    f"many (the {SMALL_SIDE_RANK}th largest of {SMALL_SIDE_RANK} x (this + 1) - 1 draws), on evidence at most "
                    f"{EVIDENCE_DRAWS} in a cluster of fewer than 2 x min-split-size members (0 = off)")
    decision_arrays: Literal["every", "evidence"] = Field(
        "evidence", alias="decision-arrays",
        description="the arrays a split's partition is reproduced on: every watched array (the paper has no such "
                    "test), or, where every array together shows no structure while the run has one cluster, the one "
                    "array whose clients' updates are the most structured in two successive rounds, then also the "
                    "only layer a split is proposed on (CFL's rule)")
    sketch_dim: int = Field(2048, alias="sketch-dim", ge=16,
                            description="update-storage = sketch: weights per client kept over the watched layers "
                                        "(a seeded sample of each layer, shared equally; the same for every client)")


@dataclass
class HiCFLState(BiPartitioningState):
    epsilon: float | None = None  # absolute ε (the paper's mode) when set; None: relative to each layer's scale
    eps_rel: float = 1.5
    scales: dict[int, dict[str, float]] = field(default_factory=dict)  # cluster -> layer -> median S at its first full window
    xi: float | None = 0.0
    tracker: StabilityTracker | None = None
    layer_keys: dict[str, list[str]] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    layer_sizes: dict[str, int] = field(default_factory=dict)
    no_split: list[dict[str, Any]] = field(default_factory=list)  # ready clusters that did not split, and why
    windows_filled: bool = False  # whether any cluster ever had every stability window full
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)  # update-storage = sketch: layer -> its sample
    last_timing: dict[str, Any] | None = None  # the last judged cluster's layer nearest ε, for the reason
    # decision-arrays = evidence: the candidates' last scores and leader (``array_choice``), the arrays chosen
    array_choice: dict[str, Any] = field(default_factory=dict)
    chosen_arrays: tuple[str, ...] = ()


# the paper's algorithm with no extension (docs/algorithms/hicfl.md, "Differences from the paper"):
# ε absolute, 0.5·η (``stability-eps = lr``), every member below it, the reference sign rule on
# raw updates, the stop rule on Sattler's absolute criteria, no fallback, side or merge rule
PAPER_HICFL: dict[str, Any] = {
    "split_timing": "criteria", "stability_eps": "lr", "xi": "auto", "timing": "all", "split": "reference", "centre_updates": False,
    "min_silhouette": -1.0, "min_kept_fraction": 0.0, "min_side": 1, "small_side_reference_draws": 0,
    "merge": False, "split_criteria": "absolute", "eps1": 0.4, "eps2": 1.6, "min_split_round": 1,
    "min_split_size": 2, "update_storage": "exact", "ask_again": False, "split_min_repliers": 0, "decision_arrays": "every",
    "same_round_splits": False,
}


# ------------------------------------------------------------ steps 4–6: timing, split, stop rule
def decide(tree: BiPartitionTree, state: HiCFLState, server_round: int, cluster: int, replies: list[TrainReply],
           decision: SplitDecision, clients: dict[str, ClientInfo], reports: list[Any], *,
           params: HiCFLParams) -> Diagnostics | None:
    """Step 4 (the layers whose members' stability is below ε), step 6 (the stop rule, or the
    structure test beyond the paper) and step 5 (the proposal, the split)."""
    tracker, layers = state.tracker, state.layers
    members = state.tree.members(cluster)
    replied = {r.key for r in replies}
    # timing and split on the members that replied this round (every member with full
    # participation); under partial participation only those with full windows vote
    # and propose, the others follow their update after the split (module docstring)
    present = [k for k in members if k in replied]
    evidence = tree.evidence(state)
    # split-timing = evidence: this round's partition of the repliers, kept every round and
    # compared with the last (the stability windows do not time the split)
    reproduction = None
    if evidence and len(replies) >= 2 and cluster not in state.merged:
        reproduction = tree.reproduce(state, server_round, cluster, [r.key for r in replies],
                                      *windows.reproduction_rows(state, replies))
    if evidence:
        present = [k for k in present if all(tracker.last_update(k, layer) is not None for layer in layers)]
        if len(present) < params.min_split_size:
            return None
    elif params.fraction_train < 1:
        present = [k for k in present if all(tracker.windowed(k, layer) is not None for layer in layers)]
        if len(present) < params.min_split_size:
            return None
    # step 4: the layers whose members' windowed stability is below ε
    values, threshold = windows.against_eps(state, cluster, present)
    if not tree.may_split(state, server_round, cluster, replies):
        return None
    windows.note_timing(state, params, server_round, cluster, values, threshold)
    # on evidence every layer proposes, or with an array chosen (decision-arrays) only its layer
    ready = windows.chosen_layers(state) if evidence else ready_layers(values, threshold, params.timing)
    if not ready:
        return None
    structure_test = params.min_silhouette > -1
    if not structure_test:
        ready = ready[:1]  # the paper: the first layer that is ready
        if not decision.heterogeneous:  # step 6, the stop rule: the members' updates agree
            return no_split(state, server_round, cluster, ready[0], "agree", decision)
    # step 5: a proposal per ready layer; with the structure test, the best-scored one
    proposals = {layer: p for layer in ready if (p := windows.propose(state, params, clients, layer, present)) is not None}
    if not proposals:
        return no_split(state, server_round, cluster, ready[0], "one_side", decision)
    choice = pick_best({layer: p["score"] for layer, p in proposals.items()},
                       params.min_silhouette if structure_test else -np.inf)
    if choice.layer is None:  # structure test: no ready layer shows two groups
        return no_split(state, server_round, cluster, max(choice.silhouettes, key=choice.silhouettes.get),
                        "silhouette", decision, silhouettes=choice.silhouettes)
    chosen = proposals[choice.layer]
    # a few members of one group, or on evidence any cut of one task's clients: no better than rotations
    # the best of several layers' splits is one of as many tests: they share one level, as
    # FedClust's layer choice does
    tested = windows.small_side_test(state, params, chosen, present, len(members), evidence, len(choice.silhouettes))
    if not tested.passes(choice.silhouette):
        return no_split(state, server_round, cluster, choice.layer, "reference" if tested.test == "small" else
                        "group_free", decision, silhouettes=choice.silhouettes, reference_silhouette=tested.reference,
                        **tested.as_record())
    if evidence:  # the split is taken only when two rounds' partitions agree, their parts pointing apart
        bound, min_cosine = params.split_agreement, params.merge_min_cosine
        if not isinstance(reproduction, Evidence) or not reproduction.passes(bound, min_cosine):
            said = (reproduction + tree.ask_again(state, [r.key for r in replies]) if isinstance(reproduction, str)
                    else reproduction.words(bound, min_cosine))
            agreement = reproduction.agreement if isinstance(reproduction, Evidence) else None
            if isinstance(reproduction, Evidence) and reproduction.reproduction.reproduces(bound):
                return no_split(state, server_round, cluster, choice.layer, "alike", decision,
                                silhouettes=choice.silhouettes, agreement=agreement, evidence=said,
                                alike=reproduction.as_record()["alike"])
            return no_split(state, server_round, cluster, choice.layer, "deferred", decision,
                            silhouettes=choice.silhouettes, agreement=agreement, evidence=said)
        chosen = {**chosen, "record": {**chosen["record"], "reproduction": reproduction.as_record()}}
    found = split(tree, state, reports, server_round, cluster, replies, decision, choice, chosen, ready, tested,
                  present)
    a, b = found["splits"][0]["children"]
    why = (reproduction.words(params.split_agreement, params.merge_min_cosine) if isinstance(reproduction, Evidence)
           else "stability fired")
    return {**found, "words": [f"cluster {cluster} split into {a} and {b} on {choice.layer} (silhouette "
                               f"{choice.silhouette:.2f}): {why}{explain.unplaced_words(state.splits[-1])}"]}


def split(tree: BiPartitionTree, state: HiCFLState, reports: list[Any], server_round: int, cluster: int,
          replies: list[TrainReply], decision: SplitDecision, choice: Any, chosen: dict[str, Any], ready: list[str],
          tested: EvidenceTest, present: list[str]) -> Diagnostics:
    """Step 5's split of ``cluster`` by the ``chosen`` proposal; every member's windows restart."""
    tracker = state.tracker
    members = state.tree.members(cluster)
    replied = {r.key for r in replies}
    keys_a, keys_b = chosen["keys"]
    S = chosen["S"]
    position = {k: i for i, k in enumerate(present)}
    record = {
        "layer": choice.layer,
        **chosen["record"],
        "ready_layers": ready,
        "silhouettes": choice.silhouettes,
        "reference_silhouette": tested.reference,
        **tested.as_record(),
        "stability": chosen["stability"],
        "relative": state.epsilon is None,
        "criterion": decision_record(decision),
        "gap": separation_gap(S, [position[k] for k in keys_a], [position[k] for k in keys_b]),
        "layers": state.layer_keys[choice.layer],
        "similarity": similarity_record(present, S),
    }
    route = {**chosen["route"], "model": replies[0].sent}
    # repliers whose windows were not full: the side this round's update points to (as
    # the descent would place them: final); members that did not reply: provisionally
    fresh: tuple[list[str], list[str]] = ([], [])
    for key in (k for k in members if k in replied and k not in position):
        fresh[side_of(tracker.last_update(key, choice.layer), route)].append(key)
    absent = [k for k in members if k not in replied]
    last = {k: v for k in absent if (v := tracker.last_update(k, choice.layer)) is not None}
    extra_a, extra_b, unplaced = tree.place_absent(state, cluster, absent, route, last)
    record["absent"] = [extra_a, extra_b]
    if unplaced:
        record["unplaced"] = unplaced
    if fresh[0] or fresh[1]:
        record["unwindowed"] = [fresh[0], fresh[1]]
    summary = tree.apply_split(state, server_round, cluster, list(keys_a) + fresh[0] + extra_a,
                               list(keys_b) + fresh[1] + extra_b, record, route, SplitCompared(present, S), reports)
    windows.restart(state, cluster, members)  # children: windows and weight selection restart
    return {"splits": [summary]}


def no_split(state: HiCFLState, server_round: int, cluster: int, layer: str, code: str, decision: SplitDecision,
             **extra: Any) -> Diagnostics:
    """A ready cluster that did not split, and why (``no_split``)."""
    entry = {"round": server_round, "cluster": cluster, "layer": layer, "code": code,
             "reason": explain.NO_SPLIT_TEXT[code], "criterion": decision_record(decision), **extra}
    state.no_split.append(entry)
    said = extra.get("evidence") if code in ("deferred", "alike") else entry["reason"]
    if code in ("reference", "group_free"):  # the numbers behind it
        said += (f"; on {layer} its members' updates cut into {extra['group_parts']} parts, but {extra['group_words']}"
                 if extra.get("group_words") else
                 f" (silhouette {explain.versus(max(extra['silhouettes'].values()), '<=', extra['reference_silhouette'], digits=2)}"
                 f" on {layer})")
    verb = "deferred" if code == "deferred" else "not split"
    return {"no_split": [{"cluster": cluster, "layer": layer, "reason": entry["reason"], **extra}],
            "words": [f"split of cluster {cluster} {verb}: {said}" if code == "deferred"
                      else f"cluster {cluster} {verb}: {said}"]}


class HiCFL(ClusteredStrategy):
    """HiCFL: splits timed by per-layer model stability (the paper's steps: the module docstring)."""
    secure_refusal = base.COMPARES_UPDATES_EVERY_ROUND  # secure aggregation refused before any message

    name = "hicfl"
    Params = HiCFLParams
    State = HiCFLState
    state: HiCFLState
    params: HiCFLParams
    figures = ("tree", "splits")
    PAPER: ClassVar[dict[str, Any]] = PAPER_HICFL
    one_cluster_reasons = {
        "stability": "split timing never met: on every layer the windowed stability (of every member or of the "
                     "median member, hicfl.timing) stayed at or above ε",
        "window": "stability windows never filled (fewer than window + 2 rounds in a cluster)",
        "agree": "a split was due (stability fired, or split-timing = evidence) but the members' updates agree (not heterogeneous)",
        "one_side": "a split was due (stability fired, or split-timing = evidence) but every proposed split left a side with fewer than hicfl.min-side members "
                    "(or, with the reference rule, everyone on one side)",
        "silhouette": "a split was due (stability fired, or split-timing = evidence) but every proposed split was refused by the structure test (hicfl.min-silhouette)",
        "reference": "a split was due (stability fired, or split-timing = evidence) but every split leaving a side of fewer than min-split-size members scored no "
                     "better than group-free rotations of the members' updates (hicfl.small-side-reference-draws)",
        "size": "too few members or replies to split, or the run ended before min-split-round",
        "deferred": "every proposed split deferred: two successive rounds never gave the same partition of the "
                    "cluster's clients (split-agreement)",
        "alike": "every partition that reproduced had parts whose mean updates point alike (cosine >= "
                 "merge-min-cosine): one task, each client's own data",
        "group_free": "no proposed split beat group-free rotations of the members' updates of its layer: one task, "
                      "each client's own data",
    }


    @property
    def bipartition(self) -> BiPartitionTree:
        """The shared tree, with HiCFL's decision; a merge restarts its members' windows."""
        return BiPartitionTree(self.params, partial(decide, params=self.params), restart=windows.restart)

    def check_train_config(self, train_config: dict[str, Any]) -> None:
        if isinstance(train_config.get("lr"), (int, float)):
            return
        if self.params.xi == "auto":
            raise StrategyParamsError('hicfl.xi = "auto" is 0.05 × the clients\' learning rate, but the train config '
                                      'has no number "lr": set xi, or pass train_config={"lr": ...}')
        if self.params.stability_eps == "lr":
            raise StrategyParamsError('hicfl.stability-eps = "lr" is 0.5 × the clients\' learning rate, but the train '
                                      'config has no number "lr": set stability-eps, or pass train_config={"lr": ...}')

    # ------------------------------------------------------------ step 1: one cluster
    def init(self, theta0: Any, train_config: Mapping[str, Any] | None = None) -> None:
        """The base's ``init``; with the clients' ``train_config`` known before round 1, ξ and ε
        from its lr now (without one, as in a loop of one's own: from round 1's train config)."""
        super().init(theta0)
        lr = (train_config or {}).get("lr")
        if isinstance(lr, (int, float)):
            self.learn_lr(float(lr))

    def learn_lr(self, lr: float) -> None:
        """ξ = 0.05 × ``lr`` and ε = 0.5 × ``lr`` (``stability-eps = "lr"``) where not set yet."""
        state, c = self.state, self.params
        if state.xi is None:
            state.xi = state.tracker.xi = 0.05 * lr
        if c.stability_eps == "lr" and state.epsilon is None:
            state.epsilon = 0.5 * lr

    def init_clusters(self) -> None:
        state, c = self.state, self.params
        self.bipartition.init(state, self.compared_names())
        state.eps_rel = c.stability_eps_rel
        state.scales = {}
        # ξ and ε from the clients' lr are set by ``learn_lr`` (``init`` or round 1) where not given
        state.epsilon = None if c.stability_eps == "lr" else c.number_or_none(c.stability_eps)
        state.xi = c.number_or_none(c.xi)
        state.tracker = StabilityTracker(c.window, state.xi, min_kept_fraction=c.min_kept_fraction)
        windows.watch(state, state.compared if c.cluster_layers == "auto" else self.select_compared_layers(c.cluster_layers))
        state.no_split = []
        state.windows_filled = False
        state.samples = {}

    def compared_changed(self) -> None:
        """Arrays no client changed are never watched (a frozen layer is perfectly stable)."""
        kept, watched = set(self.state.compared), windows.watched_names(self.state)
        windows.watch(self.state, [n for n in watched if n in kept] or watched)

    # newcomers and provisional members descend the tree; trainers return updates (bipartitioning.py)
    train_instructions, draw_sample = tree_train_instructions, tree_draw_sample
    admit, before_train = tree_admit, tree_before_train

    # ------------------------------------------------------------ steps 2–3, then the tree's round
    def after_train(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        state, c, tree = self.state, self.params, self.bipartition
        if state.xi is None or (c.stability_eps == "lr" and state.epsilon is None):  # lr known only now
            self.check_train_config(rnd.train_config)
            self.learn_lr(float(rnd.train_config["lr"]))
        silent = tree.leave_out_silent(state, replies, type(self).__name__)  # before the windows see a frozen layer
        if silent:
            self.compared_changed()
        windows.track(state, replies, tree.compact(state, rnd.clients), c.sketch_dim, c.seed)
        # stability before a split restarts the windows, so figures show the trigger; no_split: [] when none
        intro = None
        if silent or not state.said_compared:  # round 1 (and a changed comparison) names what is compared
            intro = self.compared_words()
            state.said_compared = True
        said = self.choose_arrays(rnd, replies) if c.decision_arrays == "evidence" else None
        if said:
            intro = said if intro is None else f"{intro}; {said}"
        return {**explain.stability_record(state, self.placed(rnd)), "no_split": [],
                **tree.after_train(state, rnd.number, replies, rnd.clients, rnd.reports, silent,
                                   name=type(self).__name__, intro=intro)}

    def choose_arrays(self, rnd: Round, replies: list[TrainReply]) -> str | None:
        """``decision-arrays = evidence`` (CFL's rule, ``array_choice``): while the run has one cluster
        and no array is chosen, score this round's candidates; once one is chosen, the partitions kept
        (of every array) are forgotten. The round line's words, or None."""
        state, c = self.state, self.params
        if state.chosen_arrays or len(state.models) != 1:
            return None
        chosen = array_choice.score_round(state.array_choice, rnd.number, [r.update for r in replies],
                                          windows.watched_names(state),
                                          state.theta0, min_silhouette=c.min_silhouette,
                                          reference_draws=DEFAULT_DRAWS, max_clusters=c.split_silhouette_max_k,
                                          seed=c.seed)
        if not chosen:
            return None
        state.chosen_arrays, state.proposals = tuple(chosen), {}
        return array_choice.words(state.array_choice, verb="cuts the partitions a split must reproduce, and proposes "
                                                           "splits, on")

    def compared_words(self) -> str:
        """What HiCFL compares, for round 1's line."""
        c, layers = self.params, self.state.layers
        shown = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
        if c.split_timing == "evidence":
            when = (f"a split is proposed on the best-separated of these layers and taken when two successive "
                    f"rounds give the same partition (ARI >= {c.split_agreement:.2f}), from round {c.min_split_round}")
        else:
            when = f"a split is timed by each layer's model stability over {c.window} rounds"
        return f"compares the clients' updates layer by layer ({len(layers)} layers: {shown}); {when}"

    # ------------------------------------------------------------ what a run says (clusterfed.explain)
    one_cluster_reason, one_cluster_advice, cluster_count_basis = (explain.strategy_reason, explain.strategy_advice,
                                                                     explain.strategy_basis)

    def thresholds(self) -> dict[str, Any]:
        c, state = self.params, self.state
        return {**self.bipartition.thresholds(), "stability_eps": state.epsilon, "stability_eps_rel": state.eps_rel,
                "xi": state.xi, "window": c.window, "timing": c.timing, "split": c.split,
                "min_silhouette": c.min_silhouette}

    def cluster_state(self) -> dict[str, Any]:
        cluster_state = self.bipartition.cluster_state(self.state, self.thresholds(), self.one_cluster_reason())
        cluster_state["layers"] = self.state.layers
        cluster_state["no_split"] = self.state.no_split
        # decision-arrays: the last candidates' scores, and the arrays chosen (empty: every watched array)
        cluster_state["array_choice"] = array_choice.record(self.state)
        return cluster_state
