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
``PAPER`` preset in docs/algorithms/cfl.md: the split timing (``split-timing = evidence``, the
default: the criteria are recorded, and a split that passes the acceptance test is taken only when
its cut beats group-free rotations of the round's updates and, when every member replied, leaves
no client alone (``refuse_structure``), and two successive rounds' partitions of the repliers agree with their
parts pointing apart in both, ``BiPartitionTree.reproduce`` and ``defer``; the paper's
``criteria`` is the preset's), what a split compares where the whole update shows no structure (``decision-arrays``,
``array_choice.py``), the acceptance test (best-cut silhouette on
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

from clusterfed.strategies import array_choice, base, longer_evidence
from clusterfed.clustering.bipartition import SplitDecision, bipartition
from clusterfed.clustering.null_reference import DEFAULT_DRAWS
from clusterfed.clustering.principal_scores import principal_scores
from clusterfed.clustering.split_scores import (best_cut_silhouette, cosine_similarity_matrix, separation_gap,
    split_silhouette)
from clusterfed.clustering.layer_split import evidence_reference
from clusterfed.clustering.split_evidence import halves_evidence
from clusterfed.clustering.vectors import (check_record, decision_record, flatten, kept_vectors, required_structure,
                                           restrict_vectors, similarity_record, stack_float64)
from clusterfed.explain import bipartition as explain
from clusterfed.explain.bipartition import shown_names, timing_words
from clusterfed.explain.generic import left_alone
from clusterfed.explain.numbers import compared
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.strategies.bipartitioning import (BiPartitioningParams, BiPartitioningState, BiPartitionTree, Evidence,
    replier_vectors)
from clusterfed.strategies.tree_hooks import tree_admit, tree_before_train, tree_draw_sample, tree_train_instructions
from clusterfed.core.exchange import ClientInfo, Diagnostics, Round, SplitCompared, Steps, TrainReply, natural

# similarity-decay = auto: summed updates only for clients this small (one round's update is
# mostly batch noise); similarity-rank = auto: principal components for clusters of at least
# PRINCIPAL_MIN_REPLIES repliers (measured: docs/algorithms/cfl.md, "Many small clients")
SMALL_CLIENT_EXAMPLES = 50
SMALL_CLIENT_DECAY = 0.8
PRINCIPAL_MIN_REPLIES = 40
PRINCIPAL_RANK = 5
SMALL_SIDE_DRAWS = 99  # split-timing = evidence: a small side's test level, as the largest of this many rotations (as HiCFL's; 19 in small clusters)


class CFLFamilyParams(BiPartitioningParams):
    """What CFL and LayerCFL share."""

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

    decision_arrays: Literal["every", "evidence"] = Field(
        "evidence", alias="decision-arrays",
        description="the arrays a split compares: the strategy's own (CFL: every compared array; LayerCFL: the "
                    "selected layers), or, where those and every array together show no structure while the run has "
                    "one cluster, the one array whose clients' updates are the most structured in two successive rounds")
    evidence_trainings: int = Field(
        4, alias="evidence-trainings", ge=1, le=16,
        description="split-timing = evidence: a split refused because one training's updates show no structure is "
                    "judged again, once per cluster and in the same round, on this many trainings in a row of its "
                    "repliers (each from its own last reply, for evidence only), reproduced on the chain's halves "
                    "(longer_evidence.py; 1 = off)")


class CFLParams(CFLFamilyParams):
    """CFL's parameters: the family's."""


@dataclass
class CFLFamilyState(BiPartitioningState):
    """What CFL and LayerCFL share."""

    # per client: its latest decision-layer update as sent, or its decayed sum (similarity-decay);
    # update-storage = sketch: float32 and mapped by ``sketch`` (None: short enough to keep whole)
    last_vector: dict[str, np.ndarray] = field(default_factory=dict)
    sketch: dict[str, Any] | None = None
    refused: list[dict[str, Any]] = field(default_factory=list)
    # decision-arrays = evidence: the candidates' last scores and leader (``array_choice``), the arrays chosen
    array_choice: dict[str, Any] = field(default_factory=dict)
    chosen_arrays: tuple[str, ...] = ()
    chained: set[int] = field(default_factory=set)  # evidence-trainings: the clusters judged on a chain


@dataclass
class CFLState(CFLFamilyState):
    """CFL's state: the family's."""


# the paper's Algorithm 1 with no extension (docs/algorithms/cfl.md, "Differences from the paper")
PAPER_CFL: dict[str, Any] = {
    "split_timing": "criteria", "split_criteria": "absolute", "eps1": 0.4, "eps2": 1.6, "min_split_round": 20, "min_split_size": 3,
    "split_min_silhouette": -1.0, "split_silhouette_max_k": 2, "split_reference_draws": 0,
    "similarity_decay": 0.0, "similarity_rank": 0, "similarity_pool": "repliers", "merge": False,
    "update_storage": "exact", "ask_again": False, "split_min_repliers": 0, "same_round_splits": False,
    "evidence_trainings": 1,
}


# ------------------------------------------------------------ the per-client vectors
def keep_vectors(state: CFLFamilyState, replies: list[TrainReply], names: list[str], decay: float, compact: bool,
                 sketch_dim: int, seed: int) -> None:
    """Each replier's vector of ``names`` in ``last_vector`` (``clustering/vectors.kept_vectors``)."""
    kept, state.sketch = kept_vectors(state.last_vector, {r.key: r.update for r in replies}, names, decay,
                                      compact=compact, sketch=state.sketch, sketch_dim=sketch_dim, seed=seed)
    state.last_vector.update(kept)


def similarity_decay(params: CFLFamilyParams, clients: dict[str, ClientInfo]) -> float:
    """``similarity-decay``; ``auto``: 0.8 for small clients (the median client of those known
    holds fewer than ``SMALL_CLIENT_EXAMPLES`` examples), 0 (the paper) otherwise."""
    decay = params.similarity_decay
    if decay != "auto":
        return float(decay)
    sizes = [info.num_examples for info in clients.values()]
    return SMALL_CLIENT_DECAY if sizes and float(np.median(sizes)) < SMALL_CLIENT_EXAMPLES else 0.0


def similarity_pool(params: CFLFamilyParams, state: CFLFamilyState, cluster: int, repliers: list[str]) -> list[str]:
    """The clients a split of ``cluster``, or a merge, is judged on (``similarity-pool``): its
    repliers, then, with ``members``, every other member with a stored vector in key order."""
    if params.similarity_pool == "repliers":
        return repliers
    replied, last = set(repliers), state.last_vector
    return repliers + sorted((k for k in state.tree.members(cluster) if k not in replied and k in last), key=natural)


def pooled_vectors(params: CFLFamilyParams, state: CFLFamilyState, groups: dict[int, list[TrainReply]],
                   names: list[str]) -> dict[int, np.ndarray]:
    """What a merge compares: the repliers' updates, or with ``similarity-pool = members`` each
    replying cluster's pool of stored vectors."""
    if params.similarity_pool == "repliers":
        return replier_vectors(state, groups, names)
    return {c: stack_float64([state.last_vector[k] for k in similarity_pool(params, state, c, [r.key for r in g])])
            for c, g in sorted(groups.items())}


def similarity_rank(params: CFLFamilyParams, replies: int) -> int:
    """``similarity-rank`` for a cluster of ``replies`` repliers (0: raw cosines)."""
    rank = params.similarity_rank
    if rank == "auto":
        return PRINCIPAL_RANK if replies >= PRINCIPAL_MIN_REPLIES else 0
    return int(rank)


# ------------------------------------------------------------ the split decision (Algorithm 1)
@dataclass
class Proposal:
    """A cluster's proposed bi-partition (``propose``): the clients compared (``keys``, rows of
    ``U``), their similarity ``S``, the two sides (indices and keys), the best cut's silhouette
    (``structure``) and what it had to reach, LayerCFL's check, and the record a split or a
    refusal keeps."""

    keys: list[str]
    U: np.ndarray
    S: np.ndarray
    side_a: np.ndarray
    side_b: np.ndarray
    sides: list[list[str]]
    structure: float
    required: float
    reference: float | None
    checked: Any
    compared: SplitCompared
    record: dict[str, Any]
    directions: np.ndarray | None = None  # rows a newcomer's one training is routed by, when not ``U``'s


def decide(tree: BiPartitionTree, state: CFLFamilyState, server_round: int, cluster: int, replies: list[TrainReply],
           decision: SplitDecision, clients: dict[str, ClientInfo], reports: list[Any], *, params: CFLFamilyParams,
           names: Callable[[Any], list[str]], check: Callable[..., Any] | None = None,
           enforce: bool = False, wait: Callable[[Any], str | None] | None = None) -> Diagnostics | None:
    """A near-stationary, heterogeneous cluster of enough members is cut in two by complete
    linkage of its clients' cosine similarities on the arrays ``names(state)``, if the cut
    passes the acceptance test (and ``check``, LayerCFL's, when ``enforce``)."""
    layers = names(state)
    # split-timing = evidence: this round's partition, kept every round, compared with the last
    evidence = tree.evidence(state)
    whole = state.compared
    reproduction = (tree.reproduce(state, server_round, cluster, [r.key for r in replies],
                                   stack_float64([flatten(r.update, layers) for r in replies]),
                                   None if layers == whole else stack_float64([flatten(r.update, whole)
                                                                                for r in replies]))
                    if evidence and len(replies) >= 2 and cluster not in state.merged else None)
    if not (tree.may_split(state, server_round, cluster, replies) and (evidence or decision.split)):
        return None
    proposal = propose(state, cluster, replies, decision, layers, params=params, check=check)
    refused = (refuse_structure(state, server_round, cluster, proposal, reports, params=params, evidence=evidence)
               or refuse_check(state, server_round, cluster, proposal, reports, enforce=enforce))
    if refused is None and evidence:  # taken only when two rounds' partitions agree (and LayerCFL's layers reproduced)
        refused = defer(tree, state, server_round, cluster, proposal, reports, reproduction, [r.key for r in replies],
                        params=params, wait=wait)
    if refused is not None:
        return refused
    return split(tree, state, server_round, cluster, replies, decision, proposal, reports, reproduction, params=params)


def propose(state: CFLFamilyState, cluster: int, replies: list[TrainReply], decision: SplitDecision | None,
            layers: list[str], *, params: CFLFamilyParams, check: Callable[..., Any] | None,
            pool: tuple[list[str], np.ndarray] | None = None) -> Proposal:
    """α: the similarity of the clients' vectors (similarity-pool, -decay, -rank; or ``pool``'s
    keys and rows), its bi-partition, the best cut's silhouette and the structure it must reach
    (the acceptance test, beyond the paper: structure on 1 - S beyond what noise shows), LayerCFL's check."""
    if pool is None:
        keys = similarity_pool(params, state, cluster, [r.key for r in replies])
        U = stack_float64([state.last_vector[k] for k in keys])
    else:
        keys, U = pool
    rank = similarity_rank(params, len(keys))
    S = cosine_similarity_matrix(principal_scores(U, rank) if rank else U)
    side_a, side_b = bipartition(S)
    gap = separation_gap(S, side_a, side_b)
    silhouette = split_silhouette(S, side_a, side_b)
    max_k = params.split_silhouette_max_k
    structure, structure_k = best_cut_silhouette(S, max_k) if max_k > 2 else (silhouette, 2)
    checked = check(U, side_a, side_b, similarity=S) if check is not None else None
    required, reference = required_structure(U, structure, fixed=params.split_min_silhouette, max_k=max_k,
                                             rank=rank, draws=params.split_reference_draws, seed=params.seed)
    record: dict[str, Any] = {
        "criterion": None if decision is None else decision_record(decision), "gap": gap, "silhouette": silhouette,
        "best_cut_silhouette": structure, "best_cut_k": structure_k, "required_silhouette": required,
        "reference_silhouette": reference, "layers": layers, "similarity_rank": rank,
    }
    sides = [[keys[i] for i in side_a], [keys[i] for i in side_b]]
    return Proposal(keys, U, S, side_a, side_b, sides, structure, required, reference, checked,
                    SplitCompared(keys, S), record)


def refuse_structure(state: CFLFamilyState, server_round: int, cluster: int, p: Proposal, reports: list[Any], *,
                     params: CFLFamilyParams, evidence: bool) -> Diagnostics | None:
    """A bi-partition of noise keeps the cluster whole: a cut must reach the required silhouette
    and beat group-free data strictly (updates that are all zero score 0, and so does their
    reference); on evidence a split must also pass the test against group-free rotations of the
    updates (``layer_split.evidence_reference``) and not leave one client alone."""
    structure, required, reference, record = p.structure, p.required, p.reference, p.record
    if structure < required or (reference is not None and structure <= reference):
        refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": "silhouette",
                                "members": p.sides, **record}, p.compared)
        short = (compared(structure, "<", required, between="required") if structure < required
                 else compared(structure, "<=", reference, between="group-free updates'"))
        return {"refused_splits": [{"cluster": cluster, "reason": "silhouette", "gap": record["gap"],
                                    "silhouette": record["silhouette"], "best_cut_silhouette": structure}],
                "words": [f"cluster {cluster} not split: no structure (best-cut silhouette {short})"]}
    if not evidence or p.record["similarity_rank"]:  # on principal components the reference is built in
        return None
    # a small side (2 to min-split-size - 1 members) must beat group-free rotations of the updates
    # (HiCFL's small-side test, measured on the model matrix's GRU cell), and so must any larger
    # split, in parts' separation as well as silhouette: successive rounds share each client's own
    # data, so a cut of one task can reproduce; within a round those differences are independent
    # from client to client, and the rotations keep that (group means they mix away)
    smaller = min(len(p.side_a), len(p.side_b))
    # one client's own data cannot be told from a group of one; with members absent this round a
    # lone replier may stand for them (they follow their last updates), so only when all replied
    if smaller == 1 and set(state.tree.members(cluster)) <= set(p.keys):
        alone = next(side[0] for side in p.sides if len(side) == 1)
        refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": "single", "members": p.sides,
                                **record}, p.compared)
        return {"refused_splits": [{"cluster": cluster, "reason": "single", "best_cut_silhouette": structure}],
                "words": [f"cluster {cluster} not split: its cut {left_alone('leaves', alone)}"]}
    tested = evidence_reference(p.U, smaller, rule="linkage", small_draws=SMALL_SIDE_DRAWS,
                                min_split_size=params.min_split_size, max_k=params.split_silhouette_max_k,
                                seed=params.seed, members=len(state.tree.members(cluster)))
    if tested.passes(structure):
        p.record.update(rotation_silhouette=tested.reference, **tested.as_record())
        return None
    reason = "reference" if tested.test == "small" else "group_free"
    # the silhouette a refusal by silhouette fell short of; the group test's own numbers beside it
    required = tested.reference if tested.groups is None else record["required_silhouette"]
    refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": reason, "members": p.sides,
                            **record, **tested.as_record(), "rotation_silhouette": tested.reference,
                            "required_silhouette": required}, p.compared)
    return {"refused_splits": [{"cluster": cluster, "reason": reason, "best_cut_silhouette": structure,
                                "reference_silhouette": tested.reference, **tested.as_record()}],
            "words": [f"cluster {cluster} not split: {tested.words(structure, smaller)}"]}


def refuse_check(state: CFLFamilyState, server_round: int, cluster: int, p: Proposal, reports: list[Any], *,
                 enforce: bool) -> Diagnostics | None:
    """LayerCFL's correct-clustering check, recorded; a failed check refuses the split when enforced."""
    if p.checked is None:
        return None
    record = p.record
    record["check"] = check_record(p.checked)
    if p.checked.passed or not enforce:
        return None
    refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": "check", "members": p.sides,
                            **record}, p.compared)
    return {"refused_splits": [{"cluster": cluster, "reason": "check", "gap": record["gap"],
                                "silhouette": record["silhouette"], **record["check"]}],
            "words": [f"cluster {cluster} not split: the correct-clustering check failed"]}


def defer(tree: BiPartitionTree, state: CFLFamilyState, server_round: int, cluster: int, p: Proposal, reports: list[Any],
          reproduction: Evidence | str | None, repliers: list[str], *, params: CFLFamilyParams,
          wait: Callable[[Any], str | None] | None) -> Diagnostics | None:
    """split-timing = evidence: the split waits (``deferred``) until two successive rounds'
    partitions agree (ARI >= split-agreement) with their parts pointing apart in both rounds
    (mean-update cosine below merge-min-cosine: ``alike`` when they point alike, the split the
    merge rule would undo), and ``wait`` (LayerCFL's layer choice) says nothing. A split no
    earlier round could be compared with asks its ``repliers`` again (``tree.ask_again``: the clients
    whose partition the next round compares; a similarity pool of members may hold others)."""
    bound, min_cosine = params.split_agreement, params.merge_min_cosine
    waiting = wait(state) if wait is not None else None
    if not waiting and isinstance(reproduction, Evidence) and reproduction.passes(bound, min_cosine):
        p.record["reproduction"] = reproduction.as_record()
        return None
    said = waiting or (reproduction + tree.ask_again(state, repliers) if isinstance(reproduction, str)
                       else reproduction.words(bound, min_cosine))
    agreement = reproduction.agreement if isinstance(reproduction, Evidence) else None
    alike = (not waiting and isinstance(reproduction, Evidence) and reproduction.reproduction.reproduces(bound))
    reason = "alike" if alike else "deferred"
    extra = {"alike": reproduction.as_record()["alike"]} if alike else {}
    refuse(state, reports, {"round": server_round, "cluster": cluster, "reason": reason, "members": p.sides,
                            "agreement": agreement, "evidence": said, **extra, **p.record}, p.compared)
    return {"refused_splits": [{"cluster": cluster, "reason": reason, "agreement": agreement,
                                "best_cut_silhouette": p.structure, **extra}],
            "words": [f"cluster {cluster} not split: {said}" if alike else
                      f"split of cluster {cluster} deferred: {said}"]}


def split(tree: BiPartitionTree, state: CFLFamilyState, server_round: int, cluster: int, replies: list[TrainReply],
          decision: SplitDecision | None, p: Proposal, reports: list[Any], reproduction: Evidence | str | None, *,
          params: CFLFamilyParams) -> Diagnostics:
    """Two children from the cluster's model; the model the members trained from this round is
    what a newcomer replays the split on; the members absent this round follow their vectors."""
    keys_a, keys_b = p.sides
    layers = p.record["layers"]
    rows = p.U if p.directions is None else p.directions
    route = {"rule": "nearest-mean", "names": layers, "model": replies[0].sent,
             "directions": [rows[p.side_a].mean(axis=0), rows[p.side_b].mean(axis=0)],
             **({"sketch": state.sketch} if state.sketched and state.sketch is not None else {})}
    absent = [k for k in state.tree.members(cluster) if k not in set(p.keys)]
    extra_a, extra_b, unplaced = tree.place_absent(state, cluster, absent, route, state.last_vector)
    p.record["absent"] = [extra_a, extra_b]
    if unplaced:
        p.record["unplaced"] = unplaced
    p.record["similarity"] = similarity_record(p.keys, p.S)
    summary = tree.apply_split(state, server_round, cluster, keys_a + extra_a, keys_b + extra_b, p.record, route,
                               p.compared, reports)
    a, b = summary["children"]
    why = (reproduction.words(params.split_agreement, params.merge_min_cosine) if isinstance(reproduction, Evidence)
           else f"Sattler's criteria held (mean-update norm {decision.mean_norm:.3g}, max {decision.max_norm:.3g})")
    sizes = f"{len(keys_a) + len(extra_a)} | {len(keys_b) + len(extra_b)} clients{explain.unplaced_words(p.record)}"
    return {"splits": [summary], "words": [f"cluster {cluster} split into {a} and {b} ({sizes}): {why}, "
                                           f"best-cut silhouette {p.structure:.2f}"]}


def refuse(state: CFLFamilyState, reports: list[Any], record: dict[str, Any], compared: SplitCompared) -> None:
    """Log a refused split; reported for scoring like a split."""
    state.refused.append(record)
    compared.records.append(record)
    reports.append(compared)


def compared_arrays(state: CFLState) -> list[str]:
    """CFL's decision arrays: every compared array, or the array chosen by evidence."""
    return list(state.chosen_arrays) or state.compared


def choose_arrays(strategy: Any, rnd: Round, replies: list[TrainReply]) -> str | None:
    """``decision-arrays = evidence``: while the run has one cluster and no array is chosen, score
    this round's candidates (``array_choice.score_round``, against the strategy's ``own_arrays``);
    once one is chosen, the vectors kept from now on are of its arrays (this round's repliers' at
    once). The round line's words, or None."""
    state, c = strategy.state, strategy.params
    if state.chosen_arrays or len(state.models) != 1 or not strategy.may_choose_arrays():
        return None
    chosen = array_choice.score_round(state.array_choice, rnd.number, [r.update for r in replies], state.compared,
                                      state.theta0, min_silhouette=c.split_min_silhouette,
                                      reference_draws=c.split_reference_draws,
                                      max_clusters=c.split_silhouette_max_k, seed=c.seed, own=strategy.own_arrays())
    if not chosen:
        return None
    before = strategy.decision_names()
    state.chosen_arrays = tuple(chosen)
    # earlier partitions are of every array: not comparable with the chosen one's; exact vectors
    # (this round's included) keep the chosen arrays' part; a sketch of every array cannot be cut
    state.proposals = {}
    if state.sketch is None:
        state.last_vector = restrict_vectors(state.last_vector, before, list(chosen), state.shapes)
    else:
        state.last_vector, state.sketch = {}, None
    dropped = [r for r in replies if r.key not in state.last_vector]  # kept anew, from this round's update
    keep_vectors(state, dropped, list(chosen), similarity_decay(c, rnd.clients),
                 strategy.bipartition.compact(state, rnd.clients), c.sketch_dim, c.seed)
    return array_choice.words(state.array_choice)


def split_after_training(strategy: Any, rnd: Round, replies: list[TrainReply], first_words: str | None = None
                         ) -> Diagnostics | Steps:
    """CFL's steps after training (CFL and LayerCFL bind it as their ``after_train``): leave out
    arrays no client changed (the strategy's ``compared_changed`` then picks its arrays again),
    keep each replier's vector, then per cluster the criteria and ``decide``, then merging; a
    split refused for want of structure is judged again on longer evidence (``evidence-trainings``:
    then the steps ask, ``longer_evidence.after_refusals``). ``first_words``: the round line's first words."""
    state, c, tree = strategy.state, strategy.params, strategy.bipartition
    name = type(strategy).__name__
    silent = tree.leave_out_silent(state, replies, name)
    if silent:
        strategy.compared_changed()
    # kept after the silent arrays left: every vector has the width of what is compared from now on
    keep_vectors(state, replies, strategy.decision_names(), similarity_decay(c, rnd.clients),
                 tree.compact(state, rnd.clients), c.sketch_dim, c.seed)
    intro = None
    if silent or not state.said_compared:  # round 1 (and a changed comparison) names what is compared
        intro = strategy.compared_words()
        state.said_compared = True
    if c.decision_arrays == "evidence":
        said = choose_arrays(strategy, rnd, replies)
        if said:
            intro = said if intro is None else f"{intro}; {said}"
    # refused_splits: a column every round, [] when ``decide`` refused none
    diagnostics = {"refused_splits": [], **tree.after_train(state, rnd.number, replies, rnd.clients, rnd.reports,
                                                            silent, name=name, intro=intro)}
    if first_words:
        diagnostics["decision"] = "; ".join(t for t in (first_words, diagnostics.get("decision")) if t)
    due = longer_evidence.due(strategy, rnd, replies, diagnostics["refused_splits"])
    return longer_evidence.after_refusals(strategy, rnd, due, diagnostics, decide_on_chain) if due else diagnostics


def decide_on_chain(strategy: Any, rnd: Round, cluster: int, chain: longer_evidence.Chain) -> Diagnostics | None:
    """``evidence-trainings``: ``cluster``'s split judged on its repliers' updates over ``chain``'s
    trainings by ``decide``'s tests (structure, a client alone, group-free rotations, LayerCFL's
    check), reproduced on the chain's halves in place of two rounds; a split's children are judged
    on the same chain."""
    state, c, tree = strategy.state, strategy.params, strategy.bipartition
    keys = [k for k in chain.keys if state.assignment.get(k) == cluster]
    if len(keys) < c.min_split_size or not state.tree.node(cluster).is_leaf:
        return None
    state.chained.add(cluster)
    layers, rules = strategy.decision_names(), strategy.chain_rules()

    def rows(of: dict[str, Any], names: list[str]) -> np.ndarray:
        return stack_float64([flatten(of[k], names) for k in keys])

    p = propose(state, cluster, [], None, layers, params=c, check=rules.get("check"),
                pool=(keys, stack_float64([flatten(chain.total(k), layers) for k in keys])))
    p.record["trainings"] = chain.trainings
    if all(k in state.last_vector for k in keys):  # a newcomer's descent trains once: routed by one training's
        p.directions = stack_float64([state.last_vector[k] for k in keys])
    refused = (refuse_structure(state, rnd.number, cluster, p, rnd.reports, params=c, evidence=True)
               or refuse_check(state, rnd.number, cluster, p, rnd.reports, enforce=rules.get("enforce", False)))
    if refused is not None:
        for entry in refused.get("refused_splits", []):
            entry["trainings"] = chain.trainings
        return refused
    halves = halves_evidence(rows(chain.halves[0], layers), rows(chain.halves[1], layers),
                             rows(chain.halves[0], state.compared), rows(chain.halves[1], state.compared),
                             max_k=c.split_silhouette_max_k, source=chain.source, server_round=rnd.number,
                             bound=c.split_agreement, min_cosine=c.merge_min_cosine)
    if not halves.passes(c.split_agreement, c.merge_min_cosine):
        said = halves.words(c.split_agreement, c.merge_min_cosine)
        reason = "alike" if halves.reproduction.reproduces(c.split_agreement) else "deferred"
        refuse(state, rnd.reports, {"round": rnd.number, "cluster": cluster, "reason": reason, "members": p.sides,
                                    "agreement": halves.agreement, "evidence": said, **p.record}, p.compared)
        return {"refused_splits": [{"cluster": cluster, "reason": reason, "agreement": halves.agreement,
                                    "best_cut_silhouette": p.structure, "trainings": chain.trainings}],
                "words": [f"cluster {cluster} not split: {said}"]}
    p.record["reproduction"] = halves.as_record()
    made = split(tree, state, rnd.number, cluster, [chain.first[k] for k in keys], None, p, rnd.reports, halves,
                 params=c)
    for child in made["splits"][0].get("children", []):
        more = decide_on_chain(strategy, rnd, child, chain) or {}
        for key, records in more.items():
            made.setdefault(key, []).extend(records)
    return made


class CFL(ClusteredStrategy):
    """CFL (Sattler et al.): recursive bi-partitioning on the cosine similarity of full updates."""
    secure_refusal = base.COMPARES_UPDATES_EVERY_ROUND  # secure aggregation refused before any message

    name = "cfl"
    Params = CFLParams
    State = CFLState
    state: CFLState
    params: CFLFamilyParams
    figures = ("tree", "splits")
    PAPER: ClassVar[dict[str, Any]] = {**PAPER_CFL, "decision_arrays": "every"}
    one_cluster_reasons = {
        "criteria": "split criteria never met: the cluster was never both near-stationary "
                    "(mean-update norm < rel-eps1 × its peak) and heterogeneous (max norm > rel-eps2 × mean norm)",
        "silhouette": "every proposed split refused by the structure test: best-cut silhouette below split-min-silhouette "
                      "and below what group-free updates of the same size reach",
        "size": "too few members or replies to split (min-split-size) or the run ended before min-split-round",
        "deferred": "every proposed split deferred: two successive rounds never gave the same partition of the "
                    "cluster's clients (split-agreement)",
        "alike": "every partition that reproduced had parts whose mean updates point alike (cosine >= "
                 "merge-min-cosine): one task, each client's own data",
        "reference": "every split leaving a side of fewer than min-split-size clients scored no better than "
                     "group-free rotations of the updates",
        "group_free": "no proposed split beat group-free rotations of the updates: one task, each client's own "
                      "data",
        "single": f"every proposed split {left_alone('left')}",
    }


    @property
    def bipartition(self) -> BiPartitionTree:
        """The shared tree, with CFL's decision on every compared array, or the array chosen."""
        c = self.params
        return BiPartitionTree(c, partial(decide, params=c, names=compared_arrays), merge_names=compared_arrays,
                               merge_vectors=partial(pooled_vectors, c))

    def decision_names(self) -> list[str]:
        """The arrays whose updates the similarity is computed on: every compared array, or the chosen one."""
        return compared_arrays(self.state)

    def init_clusters(self) -> None:
        self.bipartition.init(self.state, self.compared_names())

    # newcomers and provisional members descend the tree; trainers return updates (bipartitioning.py)
    train_instructions, draw_sample = tree_train_instructions, tree_draw_sample
    admit, before_train = tree_admit, tree_before_train

    def compared_changed(self) -> None:
        """Arrays no client changed left the comparison: CFL compares every array left, nothing to pick again."""

    def chain_rules(self) -> dict[str, Any]:
        """What a split judged on longer evidence applies besides ``decide``'s tests: nothing (LayerCFL: its check)."""
        return {}

    def own_arrays(self) -> tuple[str, list[str]] | None:
        """What ``decision-arrays = evidence`` must find blind besides every array: nothing more (CFL compares them all)."""
        return None

    def may_choose_arrays(self) -> bool:
        """``decision-arrays = evidence`` always may choose (CFL has no layer setting of its own)."""
        return True

    def compared_words(self) -> str:
        """What CFL compares, for round 1's line."""
        names = self.state.compared
        return (f"compares the cosine similarity of the clients' updates of every trained array ({len(names)}: "
                f"{shown_names(names)}); {timing_words(self.params)}")

    after_train = split_after_training

    # ------------------------------------------------------------ what a run says (clusterfed.explain)
    one_cluster_reason, one_cluster_advice, cluster_count_basis = (explain.strategy_reason, explain.strategy_advice,
                                                                     explain.strategy_basis)

    def cluster_state(self) -> dict[str, Any]:
        state = self.bipartition.cluster_state(self.state, self.bipartition.thresholds(), self.one_cluster_reason())
        state["refused_splits"] = self.state.refused
        # decision-arrays: the last candidates' scores, and the arrays chosen (empty: every array compared)
        state["array_choice"] = array_choice.record(self.state)
        return state
