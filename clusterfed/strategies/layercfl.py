"""LayerCFL ("LayerCFL: efficient clustered federated learning with layer-wised clustering",
the paper's Algorithm 2): Sattler's CFL (Algorithm 1) with its similarity and its split test
changed, composed, not inherited — the shared tree (``bipartitioning.py``: criteria, timing,
merging, descent) built with CFL's split decision (``cfl.decide``) given:

1. the layers the cosine similarity is computed on (Algorithm 2's layer-wise ``α``):
   ``skew = feature`` → ``conv`` (last conv layer), ``label`` → ``fc`` (first fully connected
   layer), ``unknown`` → ``all`` (every compared array, as the paper); a model without a conv
   layer falls back to ``fc``, without a fully connected one to ``final``; an explicit
   ``cluster-layers`` overrides the skew;
2. the correct-clustering check (Theorem 1, eq. 20: ``sqrt((1 − α_cross_max)/2) > γ_max``,
   γ from each client's nearest peer on its own side, ``clustering/layercfl.py``), computed
   for every proposed split after CFL's acceptance test and recorded in its ``check`` entry;
   ``correct-clustering-check = true`` (the paper) refuses a failing split (``refused_splits``).

Beyond the paper, as CFL's (``decision-arrays = evidence``, ``array_choice.py``): where the
selected layers and the whole update show no structure while the run has one cluster, the one
array whose updates are the most structured in two successive rounds is compared instead.

The split criteria stay on the full updates, as in Algorithm 1/2. Why the check is recorded,
not enforced, by default, why ``unknown`` compares every array, and why no uplink is saved:
measured in docs/algorithms/layercfl.md. Partial participation: as CFL (``cfl.py``), on the selected layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from clusterfed.strategies import array_choice, base
from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.layercfl import correct_clustering_check
from clusterfed.clustering.reproducible import Reproduction, compare
from clusterfed.clustering.split_scores import best_cut_labels, best_cut_silhouette, cosine_similarity_matrix
from clusterfed.clustering.vectors import flatten, stack_float64
from clusterfed.core.exchange import Diagnostics, Round, Steps, TrainReply, natural
from clusterfed.models.layers import select_layers
from clusterfed.explain import bipartition as explain
from clusterfed.explain.generic import left_alone
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.strategies.bipartitioning import MIN_COMMON, PROPOSALS_KEPT, BiPartitionTree
from clusterfed.strategies.tree_hooks import tree_admit, tree_before_train, tree_draw_sample, tree_train_instructions
from clusterfed.explain.bipartition import shown_names, timing_words
from clusterfed.strategies.cfl import (PAPER_CFL, CFLFamilyParams, CFLFamilyState, decide, pooled_vectors,
                                       split_after_training)

LAYER_RULE_OF_SKEW = {"feature": "conv", "label": "fc", "unknown": "all"}


def _has_layer(arrays, rule: str, compare) -> bool:
    try:
        select_layers(arrays, rule, compare)
    except ValueError:
        return False
    return True


def selected_layers(state: LayerCFLState) -> list[str]:
    """LayerCFL's decision arrays: the selected layers, or the array chosen by evidence (``decision-arrays``)."""
    return list(state.chosen_arrays) or state.selected_names


class LayerCFLParams(CFLFamilyParams):
    skew: Literal["label", "feature", "unknown"] = Field(
        "unknown", description="the data's skew, which picks the layers: feature -> conv, label -> fc, unknown -> every "
                               "layer (all)")
    cluster_layers: str = Field("auto", alias="cluster-layers",
                                description="layers the split is decided on: a rule or names; auto = by skew")
    correct_clustering_check: bool = Field(False, alias="correct-clustering-check",
                                           description="refuse splits failing the paper's Theorem 1 (false: record it only)")


@dataclass
class LayerCFLState(CFLFamilyState):
    layer_rule: str = ""
    selected_names: list[str] = field(default_factory=list)
    # split-timing = evidence, cluster-layers = auto: the candidate layers (rule -> names), each
    # one's latest partition of the repliers, and whether a choice reproduced (``choose_layers``)
    candidates: dict[str, list[str]] = field(default_factory=dict)
    candidate_partitions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    layer_settled: bool = True
    layer_evidence: dict[str, Any] | None = None


CANDIDATE_RULES = ("conv", "fc", "final")  # the layers LayerCFL may compare, its skew's rule first


def layer_deferral(state: LayerCFLState) -> str | None:
    """Why a split must wait for the layer choice (None: the choice reproduced, or is fixed, or an
    array was chosen by evidence)."""
    return None if state.layer_settled or state.chosen_arrays else "the layer choice has not reproduced yet"


class LayerCFL(ClusteredStrategy):
    """LayerCFL: CFL's splits decided on the layers the skew selects (every array for an unknown
    skew, the default: then its splits are CFL's), with the correct-clustering check recorded."""
    secure_refusal = base.COMPARES_UPDATES_EVERY_ROUND  # secure aggregation refused before any message

    name = "layercfl"
    Params = LayerCFLParams
    State = LayerCFLState
    state: LayerCFLState
    params: LayerCFLParams
    figures = ("tree", "splits")
    # Algorithm 2 with no extension: CFL's paper rules, all layers when the skew is unknown
    # (with a known skew, pass cluster_layers="auto" and skew) and the check enforced
    PAPER: ClassVar[dict[str, Any]] = {**PAPER_CFL, "cluster_layers": "all", "correct_clustering_check": True,
                                       "decision_arrays": "every"}
    one_cluster_reasons = {
        "criteria": "split criteria never met (as CFL)",
        "silhouette": "every proposed split refused by the structure test on the selected layers",
        "check": "every proposed split refused by the correct-clustering check: estimated γ_max above "
                 "sqrt((1 − α_cross_max)/2)",
        "size": "too few members or replies to split, or the run ended before min-split-round",
        "deferred": "every proposed split deferred: two successive rounds never gave the same partition of the "
                    "cluster's clients (split-agreement)",
        "alike": "every partition that reproduced had parts whose mean updates point alike (cosine >= "
                 "merge-min-cosine): one task, each client's own data",
        "group_free": "no proposed split beat group-free rotations of the selected layers' updates: one task, each "
                      "client's own data",
        "single": f"every proposed split {left_alone('left')}",
        "reference": "every split leaving a side of fewer than min-split-size clients scored no better than "
                     "group-free rotations of the selected layers' updates",
    }

    @property
    def bipartition(self) -> BiPartitionTree:
        """The shared tree, with CFL's decision on the selected layers and the check (Theorem 1)."""
        c = self.params
        return BiPartitionTree(c, partial(decide, params=c, names=selected_layers, check=correct_clustering_check,
                                          enforce=c.correct_clustering_check, wait=layer_deferral),
                               merge_names=selected_layers, merge_vectors=partial(pooled_vectors, c))

    def decision_names(self) -> list[str]:
        return selected_layers(self.state)

    def may_choose_arrays(self) -> bool:
        """``decision-arrays = evidence`` under ``cluster-layers = auto`` only: layers the user named are compared."""
        return self.params.cluster_layers == "auto"

    def own_arrays(self) -> tuple[str, list[str]] | None:
        """``decision-arrays = evidence`` chooses one array only where the selected layers show no
        structure either (every array, rule ``all``: nothing more than CFL asks)."""
        rule = self.state.layer_rule
        if rule == "all":
            return None
        return (f"the {rule} layer" if rule in CANDIDATE_RULES else "the selected layers"), self.state.selected_names

    def init_clusters(self) -> None:
        self.bipartition.init(self.state, self.compared_names())
        self.pick_layers(self.params.compare_arrays)

    def pick_layers(self, compare) -> None:
        """The layers the split is decided on, among the arrays ``compare`` selects."""
        rule = self.params.cluster_layers
        if rule == "auto":
            rule = LAYER_RULE_OF_SKEW[self.params.skew]
            # no conv layer (an MLP, a GRU) or only frozen ones: the first fc layer, else the final one
            # (an unknown skew compares every array: no rule to fall back from)
            fallbacks = {"conv": ("conv", "fc", "final"), "fc": ("fc", "final"), "all": ("all",)}[rule]
            rule = next((r for r in fallbacks if _has_layer(self.state.theta0, r, compare)), "final")
        self.state.layer_rule = rule
        self.state.selected_names = self.select_compared_layers(rule, compare)
        # on evidence, a known skew's rule is a candidate among the others until one reproduces
        candidates: dict[str, list[str]] = {}
        if self.params.cluster_layers == "auto" and self.state.split_timing == "evidence" and rule != "all":
            for candidate in (rule, *CANDIDATE_RULES):
                if _has_layer(self.state.theta0, candidate, compare):
                    names = self.select_compared_layers(candidate, compare)
                    if names not in candidates.values():
                        candidates[candidate] = names
        self.state.candidates = candidates if len(candidates) > 1 else {}
        self.state.candidate_partitions = {}
        self.state.layer_settled = not self.state.candidates

    def compared_changed(self) -> None:
        """Arrays no client changed left ``compared``: the rule picks again among the rest
        (an explicit ``cluster-layers`` keeps its layers, less the silent arrays)."""
        state = self.state
        if self.params.cluster_layers == "auto":
            self.pick_layers(list(state.compared))
        else:
            state.selected_names = [n for n in state.selected_names if n in set(state.compared)] or state.selected_names

    def compared_words(self) -> str:
        """LayerCFL's layer choice, for round 1's line (and again when the choice changes)."""
        state, c = self.state, self.params
        names = state.selected_names
        if state.candidates and not state.layer_settled:
            shown = "; ".join(f"{rule}: {shown_names(n)}" for rule, n in state.candidates.items())
            return (f"compares candidate layers ({shown}) and keeps the first whose partition of the clients "
                    f"reproduces in successive rounds; {timing_words(c)}")
        why = (f"skew {c.skew}" if c.cluster_layers == "auto" else f"cluster-layers = {c.cluster_layers}")
        what = "every trained array" if state.layer_rule == "all" else f"the {state.layer_rule} layer"
        return f"compares the clients' updates of {what} ({why}): {shown_names(names)}; {timing_words(c)}"

    # newcomers and provisional members descend the tree; trainers return updates (bipartitioning.py)
    train_instructions, draw_sample = tree_train_instructions, tree_draw_sample
    admit, before_train = tree_admit, tree_before_train

    def after_train(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics | Steps:
        """CFL's steps after training, on the selected layers (a silent array makes the layer rule
        pick again); on evidence, first the layer choice among the candidates (``choose_layers``)."""
        state = self.state
        said = self.choose_layers(rnd.number, replies) if not (state.layer_settled or state.chosen_arrays) else None
        return split_after_training(self, rnd, replies, first_words=f"LayerCFL: {said}" if said else None)

    def chain_rules(self) -> dict[str, Any]:
        """A split judged on longer evidence also passes the correct-clustering check (when enforced),
        and waits while the layer choice does."""
        return {"check": correct_clustering_check, "enforce": self.params.correct_clustering_check,
                "wait": layer_deferral}

    def choose_layers(self, server_round: int, replies: list[TrainReply]) -> str | None:
        """Each candidate layer's partition of this round's repliers (best-silhouette cut of their
        updates' cosines) against its last one: the choice goes to the candidate whose partition
        reproduces (ARI >= split-agreement) with the best cut's silhouette highest, and is kept;
        until one reproduces, splits wait. Returns the round's words."""
        state, c = self.state, self.params
        ordered = sorted(replies, key=lambda r: natural(r.key))
        keys = [r.key for r in ordered]
        if len(keys) < 3:
            return None
        found: dict[str, tuple[Reproduction | None, float]] = {}
        kept_earlier: dict[str, dict[str, Any]] = {}
        for rule, names in state.candidates.items():
            S = cosine_similarity_matrix(stack_float64([flatten(r.update, names) for r in ordered]))
            labels = best_cut_labels(S, c.split_silhouette_max_k)
            score = best_cut_silhouette(S, c.split_silhouette_max_k)[0]
            two = np.ones(len(keys), dtype=int)
            two[bipartition(S)[0]] = 0
            now = {"round": server_round, "labels": dict(zip(keys, map(int, labels))),
                   "two": dict(zip(keys, map(int, two)))}
            history = [p for p in state.candidate_partitions.get(rule, []) if p["round"] < server_round]
            state.candidate_partitions[rule] = (history + [now])[-PROPOSALS_KEPT:]
            # the latest earlier partition sharing enough clients (partial participation)
            earlier = next((p for p in reversed(history) if sum(k in p["labels"] for k in keys) >= MIN_COMMON), None)
            reproduction = None
            if earlier is not None:
                kept_earlier[rule] = earlier
                common = [k for k in keys if k in earlier["labels"]]
                reproduction = max((compare([earlier[kind][k] for k in common], [now[kind][k] for k in common],
                                            f"rounds {earlier['round']} and {server_round}")
                                    for kind in ("labels", "two")), key=lambda r: r.agreement)
            found[rule] = (reproduction, score)
        passing = {rule: score for rule, (rep, score) in found.items()
                   if rep is not None and rep.reproduces(c.split_agreement)}
        bound = c.split_agreement
        others = "; ".join(f"{rule}: {rep.words(bound)}, silhouette {score:.2f}" for rule, (rep, score) in found.items()
                           if rep is not None)
        if not passing:
            return f"layer choice deferred ({others})" if others else None
        rule = max(passing, key=passing.get)
        changed = state.candidates[rule] != state.selected_names
        state.layer_rule, state.selected_names, state.layer_settled = rule, state.candidates[rule], True
        state.layer_evidence = {"round": server_round, "rule": rule, "silhouette": passing[rule],
                                **found[rule][0].as_record()}
        if changed:  # the vectors and partitions kept were of the other layers: the candidate's own instead
            state.last_vector.clear()
            state.sketch = None
            earlier = kept_earlier[rule]
            state.proposals = {}
            for cluster in set(state.assignment.values()):
                kept = [k for k in state.tree.members(cluster) if k in earlier["labels"]]
                state.proposals[cluster] = [{"round": earlier["round"],
                                             "best": {k: earlier["labels"][k] for k in kept},
                                             "two": {k: earlier["two"][k] for k in kept}}]
        return (f"layer choice: {rule} ({shown_names(state.selected_names)}), whose partition reproduces with the "
                f"best silhouette ({others})")

    # ------------------------------------------------------------ what a run says (clusterfed.explain)
    one_cluster_reason, one_cluster_advice, cluster_count_basis = (explain.strategy_reason, explain.strategy_advice,
                                                                     explain.strategy_basis)

    def cluster_state(self) -> dict[str, Any]:
        state = self.bipartition.cluster_state(self.state, self.bipartition.thresholds(), self.one_cluster_reason())
        state["refused_splits"] = self.state.refused
        state["layers"] = {"rule": self.state.layer_rule, "names": self.state.selected_names}
        # decision-arrays: the last candidates' scores, and the array chosen (empty: the selected layers compared)
        state["array_choice"] = array_choice.record(self.state)
        return state
