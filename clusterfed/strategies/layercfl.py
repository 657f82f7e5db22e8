"""LayerCFL (layer-wise clustered federated learning; "LayerCFL: efficient clustered federated
learning with layer-wised clustering", the paper's Algorithm 2).

Sattler's CFL procedure (Algorithm 2 is Algorithm 1 with lines 2 and 3 changed): the shared
tree (``bipartitioning.py``: criteria, timing, merging) with CFL's split decision
(``cfl.decide``: complete-linkage bi-partition and acceptance test), composed, not inherited,
with two changes:

1. the cosine similarity is computed on the updates of the selected layers only:
   ``skew = feature`` → ``conv`` (last conv layer), ``label`` → ``fc`` (first fully
   connected layer), ``unknown`` → ``conv`` (**default choice**, see below); a model
   without a conv layer (an MLP, a GRU, a Transformer) falls back to ``fc``, and without
   a fully connected one to ``final``; an explicit ``cluster-layers`` (``fc``, ``all``, a
   rule or layer names) overrides the skew;
2. the correct-clustering check (Theorem 1, eq. 20: ``sqrt((1 − α_cross_max)/2) > γ_max``)
   with γ estimated from each client's nearest peer on its own side
   (``clustering/layercfl.estimate_gammas``: the side-mean estimator would veto every
   correct top-level split of a 4-group hierarchy) is computed for every proposed split
   and **recorded** in its ``check`` entry (passed, α_cross_max, γ_max, bound).
   ``correct-clustering-check = true`` enforces it as the paper does: a failing split is
   refused, logged in ``refused_splits`` and proposed again later while the criteria hold.
   CFL's silhouette acceptance test (``split-min-silhouette``, on the selected layers'
   updates) is inherited and applied first: a proposal it refuses never reaches the check
   (reason ``silhouette``).

**Why the check is recorded, not enforced, by default.** Evaluated on the *true*
partition of small clients, the bound is below the estimated γ_max: two same-group clients'
SGD updates are far from parallel, so the theorem cannot certify even the correct
clustering, and enforced it leaves LayerCFL equal to FedAvg. iid clients are kept whole by
the silhouette test instead.

**Why ``unknown`` → the last conv layer.** Measured end to end, conv separated rotation and
label-swap best; choosing conv or fc per proposal by the better best-cut silhouette
(``split_rules.best_separated_layers``) did worse; all layers is CFL itself. The
measurements behind both choices: docs/algorithms/layercfl.md.

The split criteria (stationarity / heterogeneity) stay on the full updates, as in
Algorithm 1/2 of the paper: they describe the cluster's training state, not its structure.

Uplink: the protocol aggregates full updates every round, so every member uploads its
whole update anyway and the split decision reads the selected layers out of that same
upload — LayerCFL saves no uplink here. It would only save uplink in a protocol with
rounds that do not aggregate. (Newcomers placed after a split do upload only the
selected layers: ``bipartitioning.py``.)

Partial participation (``fraction-train`` < 1): as CFL (``cfl.py``) — criteria and split
on this round's repliers; a member that did not reply follows its latest update of the
selected layers to the nearer side (the larger side when it has none) until it is placed
by the newcomer descent from that split when next sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, ClassVar, Literal

from pydantic import Field

from clusterfed.clustering.layercfl import correct_clustering_check
from clusterfed.explain import bipartition as explain
from clusterfed.models.layers import select_layers
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.strategies.bipartitioning import BiPartitionTree, placements
from clusterfed.strategies.cfl import (
    PAPER_CFL,
    CFLParams,
    CFLState,
    decide,
    keep_vectors,
    pooled_vectors,
    similarity_decay,
)
from clusterfed.strategies.exchange import RETURN_UPDATE, Diagnostics, TrainReply

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

    @cached_property
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
            # a model without conv layers (an MLP, a GRU, a Transformer) or whose conv layers
            # no client changes (a frozen backbone): its first fully connected layer; without
            # one either, the final layer
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

    def train_instructions(self, server_round: int, key: str) -> dict[str, Any]:
        return {"return": RETURN_UPDATE}

    def draw_sample(self, server_round: int) -> list[str] | None:
        """Placing a provisional member asks it for work: sample before placement."""
        return self.sample_active()

    def admit(self, server_round: int, keys: list[str]) -> Any:
        """Newcomers descend the tree (``bipartitioning.py``)."""
        return placements(self.train_asks, server_round, self.bipartition.admit(self.state, server_round, keys))

    def before_train(self, server_round: int) -> Any:
        """Sampled members placed provisionally at a split they sat out descend from it now."""
        return placements(self.train_asks, server_round,
                          self.bipartition.place_provisional(self.state, self.reachable(self.placed())))

    def after_train(self, server_round: int, replies: list[TrainReply]) -> Diagnostics:
        """As CFL's round, on the selected layers; a silent array makes the layer rule pick again."""
        state, c, tree = self.state, self.params, self.bipartition
        keep_vectors(state, replies, self.decision_names(), similarity_decay(c, self.clients),
                     tree.compact(state, self.clients), c.sketch_dim, c.seed)
        silent = tree.leave_out_silent(state, replies, type(self).__name__)
        if silent:
            self.compared_changed()
        return {"refused_splits": [], **tree.after_train(state, server_round, replies, self.clients, self.reports,
                                                         silent)}

    # ------------------------------------------------------------ what a run says (clusterfed.explain)
    def one_cluster_reason(self) -> str | None:
        return explain.one_cluster_reason(self.state, self.params, self.one_cluster_reasons)

    def one_cluster_advice(self) -> str | None:
        return explain.one_cluster_advice(self.state)

    def cluster_count_basis(self) -> str | None:
        return explain.cluster_count_basis(self.state, self.params)

    def cluster_state(self) -> dict[str, Any]:
        state = self.bipartition.cluster_state(self.state, self.bipartition.thresholds(), self.one_cluster_reason())
        state["refused_splits"] = self.state.refused
        state["layers"] = {"rule": self.state.layer_rule, "names": self.state.selected_names}
        return state
