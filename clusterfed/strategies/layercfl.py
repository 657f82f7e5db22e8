"""LayerCFL ("LayerCFL: efficient clustered federated learning with layer-wised clustering",
the paper's Algorithm 2): Sattler's CFL (Algorithm 1) with its similarity and its split test
changed, composed, not inherited — the shared tree (``bipartitioning.py``: criteria, timing,
merging, descent) built with CFL's split decision (``cfl.decide``) given:

1. the layers the cosine similarity is computed on (Algorithm 2's layer-wise ``α``):
   ``skew = feature`` → ``conv`` (last conv layer), ``label`` → ``fc`` (first fully connected
   layer), ``unknown`` → ``conv`` (our choice; the paper: all layers); a model without a conv
   layer falls back to ``fc``, without a fully connected one to ``final``; an explicit
   ``cluster-layers`` overrides the skew;
2. the correct-clustering check (Theorem 1, eq. 20: ``sqrt((1 − α_cross_max)/2) > γ_max``,
   γ from each client's nearest peer on its own side, ``clustering/layercfl.py``), computed
   for every proposed split after CFL's acceptance test and recorded in its ``check`` entry;
   ``correct-clustering-check = true`` (the paper) refuses a failing split (``refused_splits``).

The split criteria stay on the full updates, as in Algorithm 1/2. Why the check is recorded,
not enforced, by default, why ``unknown`` → conv, and why no uplink is saved: measured in
docs/algorithms/layercfl.md. Partial participation: as CFL (``cfl.py``), on the selected layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import Field

from clusterfed.strategies import base
from clusterfed.clustering.layercfl import correct_clustering_check
from clusterfed.models.layers import select_layers
from clusterfed.explain import bipartition as explain
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.strategies.bipartitioning import (BiPartitionTree, tree_admit, tree_before_train, tree_draw_sample,
    tree_train_instructions)
from clusterfed.strategies.cfl import PAPER_CFL, CFLParams, CFLState, decide, pooled_vectors, split_after_training

LAYER_RULE_OF_SKEW = {"feature": "conv", "label": "fc", "unknown": "conv"}


def _has_layer(arrays, rule: str, compare) -> bool:
    try:
        select_layers(arrays, rule, compare)
    except ValueError:
        return False
    return True


def selected_layers(state: LayerCFLState) -> list[str]:
    """LayerCFL's decision arrays: the selected layers."""
    return state.selected_names


class LayerCFLParams(CFLParams):
    skew: Literal["label", "feature", "unknown"] = Field(
        "unknown", description="the data's skew, which picks the layers: feature -> conv, label -> fc, unknown -> conv")
    cluster_layers: str = Field("auto", alias="cluster-layers",
                                description="layers the split is decided on: a rule or names; auto = by skew")
    correct_clustering_check: bool = Field(False, alias="correct-clustering-check",
                                           description="refuse splits failing the paper's Theorem 1 (false: record it only)")


@dataclass
class LayerCFLState(CFLState):
    layer_rule: str = ""
    selected_names: list[str] = field(default_factory=list)


class LayerCFL(ClusteredStrategy):
    """LayerCFL: CFL's splits decided on selected layers, with the correct-clustering check."""
    secure_refusal = base.COMPARES_UPDATES_EVERY_ROUND  # secure aggregation refused before any message

    name = "layercfl"
    Params = LayerCFLParams
    State = LayerCFLState
    state: LayerCFLState
    params: LayerCFLParams
    figures = ("tree", "splits")
    # Algorithm 2 with no extension: CFL's paper rules, all layers when the skew is unknown
    # (with a known skew, pass cluster_layers="auto" and skew) and the check enforced
    PAPER: ClassVar[dict[str, Any]] = {**PAPER_CFL, "cluster_layers": "all", "correct_clustering_check": True}
    one_cluster_reasons = {
        "criteria": "split criteria never met (as CFL)",
        "silhouette": "every proposed split refused by the structure test on the selected layers",
        "check": "every proposed split refused by the correct-clustering check: estimated γ_max above "
                 "sqrt((1 − α_cross_max)/2)",
        "size": "too few members or replies to split, or the run ended before min-split-round",
    }

    @property
    def bipartition(self) -> BiPartitionTree:
        """The shared tree, with CFL's decision on the selected layers and the check (Theorem 1)."""
        c = self.params
        return BiPartitionTree(c, partial(decide, params=c, names=selected_layers, check=correct_clustering_check,
                                          enforce=c.correct_clustering_check),
                               merge_names=selected_layers, merge_vectors=partial(pooled_vectors, c))

    def decision_names(self) -> list[str]:
        return self.state.selected_names

    def init_clusters(self) -> None:
        self.bipartition.init(self.state, self.compared_names())
        self.pick_layers(self.params.compare_arrays)

    def pick_layers(self, compare) -> None:
        """The layers the split is decided on, among the arrays ``compare`` selects."""
        rule = self.params.cluster_layers
        if rule == "auto":
            rule = LAYER_RULE_OF_SKEW[self.params.skew]
            # no conv layer (an MLP, a GRU) or only frozen ones: the first fc layer, else the final one
            fallbacks = {"conv": ("conv", "fc", "final"), "fc": ("fc", "final")}[rule]
            rule = next((r for r in fallbacks if _has_layer(self.state.theta0, r, compare)), "final")
        self.state.layer_rule = rule
        self.state.selected_names = self.select_compared_layers(rule, compare)

    def compared_changed(self) -> None:
        """Arrays no client changed left ``compared``: the rule picks again among the rest
        (an explicit ``cluster-layers`` keeps its layers, less the silent arrays)."""
        state = self.state
        if self.params.cluster_layers == "auto":
            self.pick_layers(list(state.compared))
        else:
            state.selected_names = [n for n in state.selected_names if n in set(state.compared)] or state.selected_names

    # newcomers and provisional members descend the tree; trainers return updates (bipartitioning.py)
    train_instructions, draw_sample = tree_train_instructions, tree_draw_sample
    admit, before_train = tree_admit, tree_before_train

    # CFL's steps after training, on the selected layers (a silent array makes the layer rule pick again)
    after_train = split_after_training

    # ------------------------------------------------------------ what a run says (clusterfed.explain)
    one_cluster_reason, one_cluster_advice, cluster_count_basis = (explain.strategy_reason, explain.strategy_advice,
                                                                     explain.strategy_basis)

    def cluster_state(self) -> dict[str, Any]:
        state = self.bipartition.cluster_state(self.state, self.bipartition.thresholds(), self.one_cluster_reason())
        state["refused_splits"] = self.state.refused
        state["layers"] = {"rule": self.state.layer_rule, "names": self.state.selected_names}
        return state
