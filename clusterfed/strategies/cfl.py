"""CFL: clustered FL by recursive bi-partitioning (Sattler, Müller and Samek, "Clustered
Federated Learning: Model-Agnostic Distributed Multitask Optimization Under Privacy
Constraints", IEEE TNNLS 2020), Algorithm 1, read top to bottom:

- every round each cluster's members send their update Δ_c (``return = update``) and the round
  skeleton averages per cluster;
- for every cluster that replied, Algorithm 1's split condition on the members' full updates,
  ``‖Σ n_c/N Δ_c‖ < ε1`` and ``max_c ‖Δ_c‖ > ε2``, at least ``min-split-size`` members, not
  before ``min-split-round``: the shared tree's criteria (``bipartitioning.py``;
  ``split-criteria = absolute`` is the paper's, ``relative`` scales ε1, ε2 to the cluster);
- ``decide``: the cosine similarity α of the clients' updates, the bi-partition
  ``argmin max α`` by complete linkage, both children starting from the cluster's model.

Beyond the paper, each a ``Params`` field listed with the paper's rule, our default and the
``PAPER`` preset in docs/algorithms/cfl.md: the acceptance test (best-cut silhouette on
``1 − α`` against ``split-min-silhouette`` or group-free updates; refusals in
``refused_splits``), summed updates (``similarity-decay``), principal components
(``similarity-rank``), the pool a split is judged on (``similarity-pool``), merging and compact
vectors (the tree's). The side-based Gap is recorded, never a veto. Partial participation:
criteria and split on the round's repliers; the others follow their latest vector and descend
when next sampled. The per-client vectors (``last_vector``) are each client's latest update of
the decision arrays, or its decayed sum, exact or count-sketched. LayerCFL (``layercfl.py``)
passes ``decide`` its layers and its check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from clusterfed.strategies import base
from clusterfed.clustering.bipartition import SplitDecision, bipartition
from clusterfed.clustering.null_reference import DEFAULT_DRAWS
from clusterfed.clustering.principal_scores import principal_scores
from clusterfed.clustering.split_scores import (best_cut_silhouette, cosine_similarity_matrix, separation_gap,
    split_silhouette)
from clusterfed.clustering.vectors import (check_record, decision_record, kept_vectors, required_structure,
    similarity_record, stack_float64)
from clusterfed.explain import bipartition as explain
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.strategies.bipartitioning import (BiPartitioningParams, BiPartitioningState, BiPartitionTree,
    replier_vectors, tree_admit, tree_before_train, tree_draw_sample,
    tree_train_instructions)
from clusterfed.core.exchange import ClientInfo, Diagnostics, Round, SplitCompared, TrainReply, natural

# similarity-decay = auto: summed updates only for clients this small (one round's update is
# mostly batch noise); similarity-rank = auto: principal components for clusters of at least
# PRINCIPAL_MIN_REPLIES repliers (measured: docs/algorithms/cfl.md, "Many small clients")
SMALL_CLIENT_EXAMPLES = 50
SMALL_CLIENT_DECAY = 0.8
PRINCIPAL_MIN_REPLIES = 40
PRINCIPAL_RANK = 5


class CFLParams(BiPartitioningParams):
    split_min_silhouette: float = Field(
        0.3, alias="split-min-silhouette", ge=-1, le=1,
        description="keep a proposed bi-partition only if the best cut's silhouette on 1 - cos reaches this (-1 = off), "
                    "or beats what group-free updates of the same size reach (split-reference-draws)")
    split_reference_draws: int = Field(
        DEFAULT_DRAWS, alias="split-reference-draws", ge=0,
        description="a best cut below split-min-silhouette still counts when it beats the best silhouette of this "
                    "many group-free Gaussian reference sets shaped like the updates (0 = fixed threshold only)")
    similarity_decay: Annotated[float, Field(ge=0, lt=1)] | Literal["auto"] = Field(
        "auto", alias="similarity-decay",
        description="the similarity compares each client's updates summed over its rounds with this decay "
                    "(0 = this round's update only, as in the paper); auto = 0.8 when the median client holds "
                    f"fewer than {SMALL_CLIENT_EXAMPLES} examples, else 0")
    similarity_rank: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        0, alias="similarity-rank",
        description="compare the cosines of the updates' coordinates on this many leading principal components "
                    "(centred; 0 = the raw updates, as in the paper), and accept a split only if it beats "
                    f"group-free updates (split-reference-draws); auto = {PRINCIPAL_RANK} for clusters of at "
                    f"least {PRINCIPAL_MIN_REPLIES} repliers, else 0")
    similarity_pool: Literal["repliers", "members"] = Field(
        "repliers", alias="similarity-pool",
        description="the clients a split or a merge is judged on: this round's repliers (the paper), or every "
                    "member of the cluster with a stored update (the repliers' new ones, the others' last; the "
                    "same at full participation)")


@dataclass
class CFLState(BiPartitioningState):
    # per client: its latest decision-layer update as sent, or its decayed sum (similarity-decay);
    # update-storage = sketch: float32 and mapped by ``sketch`` (None: short enough to keep whole)
    last_vector: dict[str, np.ndarray] = field(default_factory=dict)
    sketch: dict[str, Any] | None = None
    refused: list[dict[str, Any]] = field(default_factory=list)




# the paper's Algorithm 1 with no extension (docs/algorithms/cfl.md, "Differences from the paper")
PAPER_CFL: dict[str, Any] = {
    "split_criteria": "absolute", "eps1": 0.4, "eps2": 1.6, "min_split_round": 20, "min_split_size": 3,
    "split_min_silhouette": -1.0, "split_silhouette_max_k": 2, "split_reference_draws": 0,
    "similarity_decay": 0.0, "similarity_rank": 0, "similarity_pool": "repliers", "merge": False,
    "update_storage": "exact",
}


# ------------------------------------------------------------ the per-client vectors
def keep_vectors(state: CFLState, replies: list[TrainReply], names: list[str], decay: float, compact: bool,
                 sketch_dim: int, seed: int) -> None:
    """Each replier's vector of ``names`` in ``last_vector`` (``clustering/vectors.kept_vectors``)."""
    kept, state.sketch = kept_vectors(state.last_vector, {r.key: r.update for r in replies}, names, decay,
                                      compact=compact, sketch=state.sketch, sketch_dim=sketch_dim, seed=seed)
    state.last_vector.update(kept)


def similarity_decay(params: CFLParams, clients: dict[str, ClientInfo]) -> float:
    """``similarity-decay``; ``auto``: 0.8 for small clients (the median client of those known
    holds fewer than ``SMALL_CLIENT_EXAMPLES`` examples), 0 (the paper) otherwise."""
    decay = params.similarity_decay
    if decay != "auto":
        return float(decay)
    sizes = [info.num_examples for info in clients.values()]
    return SMALL_CLIENT_DECAY if sizes and float(np.median(sizes)) < SMALL_CLIENT_EXAMPLES else 0.0


def similarity_pool(params: CFLParams, state: CFLState, cluster: int, repliers: list[str]) -> list[str]:
    """The clients a split of ``cluster``, or a merge, is judged on (``similarity-pool``): its
    repliers, then, with ``members``, every other member with a stored vector in key order."""
    if params.similarity_pool == "repliers":
        return repliers
    replied, last = set(repliers), state.last_vector
    return repliers + sorted((k for k in state.tree.members(cluster) if k not in replied and k in last), key=natural)


def pooled_vectors(params: CFLParams, state: CFLState, groups: dict[int, list[TrainReply]],
                   names: list[str]) -> dict[int, np.ndarray]:
    """What a merge compares: the repliers' updates, or with ``similarity-pool = members`` each
    replying cluster's pool of stored vectors."""
    if params.similarity_pool == "repliers":
        return replier_vectors(state, groups, names)
    return {c: stack_float64([state.last_vector[k] for k in similarity_pool(params, state, c, [r.key for r in g])])
            for c, g in sorted(groups.items())}


def similarity_rank(params: CFLParams, replies: int) -> int:
    """``similarity-rank`` for a cluster of ``replies`` repliers (0: raw cosines)."""
    rank = params.similarity_rank
    if rank == "auto":
        return PRINCIPAL_RANK if replies >= PRINCIPAL_MIN_REPLIES else 0
    return int(rank)


# ------------------------------------------------------------ the split decision (Algorithm 1)
def decide(tree: BiPartitionTree, state: CFLState, server_round: int, cluster: int, replies: list[TrainReply],
           decision: SplitDecision, clients: dict[str, ClientInfo], reports: list[Any], *, params: CFLParams,
           names: Callable[[Any], list[str]], check: Callable[..., Any] | None = None,
           enforce: bool = False) -> Diagnostics | None:
    """A near-stationary, heterogeneous cluster of enough members is cut in two by complete
    linkage of its clients' cosine similarities on the arrays ``names(state)``, if the cut
    passes the acceptance test (and ``check``, LayerCFL's, when ``enforce``)."""
    if not (decision.split and tree.may_split(state, server_round, cluster, replies)):
        return None
    # α: the similarity of the clients' vectors (similarity-pool, -decay, -rank), two sides
    keys = similarity_pool(params, state, cluster, [r.key for r in replies])
    U = stack_float64([state.last_vector[k] for k in keys])
    rank = similarity_rank(params, len(keys))
    S = cosine_similarity_matrix(principal_scores(U, rank) if rank else U)
    side_a, side_b = bipartition(S)
    gap = separation_gap(S, side_a, side_b)
    silhouette = split_silhouette(S, side_a, side_b)
    # the acceptance test (beyond the paper): structure on 1 - S beyond what noise shows
    max_k = params.split_silhouette_max_k
    structure, structure_k = best_cut_silhouette(S, max_k) if max_k > 2 else (silhouette, 2)
    checked = check(U, side_a, side_b, similarity=S) if check is not None else None
    required, reference = required_structure(U, structure, fixed=params.split_min_silhouette, max_k=max_k,
                                             rank=rank, draws=params.split_reference_draws, seed=params.seed)
    compared = SplitCompared(keys, S)
    layers = names(state)
    record: dict[str, Any] = {
        "criterion": decision_record(decision), "gap": gap, "silhouette": silhouette,
        "best_cut_silhouette": structure, "best_cut_k": structure_k, "required_silhouette": required,
        "reference_silhouette": reference, "layers": layers, "similarity_rank": rank,
    }
    sides = [[keys[i] for i in side_a], [keys[i] for i in side_b]]
    # a bi-partition of noise keeps the cluster whole; a cut must beat group-free data
    # strictly (updates that are all zero score 0, and so does their reference)
    if structure < required or (reference is not None and structure <= reference):
        refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": "silhouette", "members": sides,
                                **record}, compared)
        return {"refused_splits": [{"cluster": cluster, "reason": "silhouette", "gap": gap,
                                    "silhouette": silhouette, "best_cut_silhouette": structure}]}
    if checked is not None:
        record["check"] = check_record(checked)
        if not checked.passed and enforce:
            refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": "check", "members": sides,
                                    **record}, compared)
            return {"refused_splits": [{"cluster": cluster, "reason": "check", "gap": gap,
                                        "silhouette": silhouette, **record["check"]}]}
    # two children from the cluster's model; the model the members trained from this round
    # is what a newcomer replays the split on
    keys_a, keys_b = sides
    route = {"rule": "nearest-mean", "names": layers, "model": replies[0].sent,
             "directions": [U[side_a].mean(axis=0), U[side_b].mean(axis=0)],
             **({"sketch": state.sketch} if state.sketched and state.sketch is not None else {})}
    absent = [k for k in state.tree.members(cluster) if k not in set(keys)]
    extra_a, extra_b = tree.place_absent(state, cluster, absent, route, state.last_vector, (len(keys_a), len(keys_b)))
    record["absent"] = [extra_a, extra_b]
    record["similarity"] = similarity_record(keys, S)
    summary = tree.apply_split(state, server_round, cluster, keys_a + extra_a, keys_b + extra_b, record, route,
                               compared, reports)
    return {"splits": [summary]}


def refuse(state: CFLState, reports: list[Any], record: dict[str, Any], compared: SplitCompared) -> None:
    """Log a refused split; reported for scoring like a split."""
    state.refused.append(record)
    compared.records.append(record)
    reports.append(compared)


def compared_arrays(state: CFLState) -> list[str]:
    """CFL's decision arrays: every compared array."""
    return state.compared


def split_after_training(strategy: Any, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
    """CFL's steps after training (CFL and LayerCFL bind it as their ``after_train``): keep each
    replier's vector, leave out arrays no client changed (the strategy's ``compared_changed``
    then picks its arrays again), then per cluster the criteria and ``decide``, then merging."""
    state, c, tree = strategy.state, strategy.params, strategy.bipartition
    keep_vectors(state, replies, strategy.decision_names(), similarity_decay(c, rnd.clients),
                 tree.compact(state, rnd.clients), c.sketch_dim, c.seed)
    silent = tree.leave_out_silent(state, replies, type(strategy).__name__)
    if silent:
        strategy.compared_changed()
    # refused_splits: a column every round, [] when ``decide`` refused none
    return {"refused_splits": [], **tree.after_train(state, rnd.number, replies, rnd.clients, rnd.reports, silent)}


class CFL(ClusteredStrategy):
    """CFL (Sattler et al.): recursive bi-partitioning on the cosine similarity of full updates."""
    secure_refusal = base.COMPARES_UPDATES_EVERY_ROUND  # secure aggregation refused before any message

    name = "cfl"
    Params = CFLParams
    State = CFLState
    state: CFLState
    params: CFLParams
    figures = ("tree", "splits")
    PAPER: ClassVar[dict[str, Any]] = PAPER_CFL
    one_cluster_reasons = {
        "criteria": "split criteria never met: the cluster was never both near-stationary "
                    "(mean-update norm < rel-eps1 × its peak) and heterogeneous (max norm > rel-eps2 × mean norm)",
        "silhouette": "every proposed split refused by the structure test: best-cut silhouette below split-min-silhouette "
                      "and below what group-free updates of the same size reach",
        "size": "too few members or replies to split (min-split-size) or the run ended before min-split-round",
    }


    @property
    def bipartition(self) -> BiPartitionTree:
        """The shared tree, with CFL's decision on every compared array."""
        c = self.params
        return BiPartitionTree(c, partial(decide, params=c, names=compared_arrays), merge_names=compared_arrays,
                               merge_vectors=partial(pooled_vectors, c))

    def decision_names(self) -> list[str]:
        """The arrays whose updates the similarity is computed on: every compared array."""
        return self.state.compared

    def init_clusters(self) -> None:
        self.bipartition.init(self.state, self.compared_names())

    # newcomers and provisional members descend the tree; trainers return updates (bipartitioning.py)
    train_instructions, draw_sample = tree_train_instructions, tree_draw_sample
    admit, before_train = tree_admit, tree_before_train

    def compared_changed(self) -> None:
        """Arrays no client changed left the comparison: CFL compares every array left, nothing to pick again."""

    after_train = split_after_training

    # ------------------------------------------------------------ what a run says (clusterfed.explain)
    one_cluster_reason, one_cluster_advice, cluster_count_basis = (explain.strategy_reason, explain.strategy_advice,
                                                                     explain.strategy_basis)

    def cluster_state(self) -> dict[str, Any]:
        state = self.bipartition.cluster_state(self.state, self.bipartition.thresholds(), self.one_cluster_reason())
        state["refused_splits"] = self.state.refused
        return state
