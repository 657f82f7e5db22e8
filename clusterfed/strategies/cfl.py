"""Clustered FL by recursive bi-partitioning (Sattler, Müller and Samek, "Clustered
Federated Learning: Model-Agnostic Distributed Multitask Optimization Under Privacy
Constraints", IEEE TNNLS 2020).

Every round each cluster's members train its model and send their update Δ_c
(``return = update``); the base averages per cluster. Then, for every cluster that
replied (``after_train``):

1. criteria on the members' full updates of this round (every compared array: trainable
   floating-point arrays, not buffers such as BatchNorm's counters; ``compare-arrays``):
   ``mean-norm = ||Σ n_c/N Δ_c||``
   and ``max-norm = max_c ||Δ_c||`` (``split-criteria``: ``relative`` by default,
   ``absolute`` = Sattler's ``eps1``/``eps2``);
2. if the cluster is near-stationary and heterogeneous, has at least ``min-split-size``
   members (and as many replies) and the round is ≥ ``min-split-round``: cosine
   similarity of the repliers' updates, two sides by complete linkage. **Choice, beyond
   the paper (``similarity-decay``; ``auto`` = 0.8 for clients of fewer than 50 examples, else
   0 = the paper's this-round update):**
   each client's vector is its updates summed over its rounds with that decay. A client
   of a few dozen examples sends an update dominated by the noise of its batches; its
   group's pull repeats every round while that noise does not, so the sum separates the
   groups where one round's update cannot;
3. **noise-aware acceptance (choice, beyond the paper)**: the proposed split is kept only if
   the cluster shows structure on the cosine distances ``1 − S``: the best silhouette over
   the complete-linkage cuts into 2..``split-silhouette-max-k`` clusters
   (``bipartition.best_cut_silhouette``) reaches ``split-min-silhouette`` — or, when it
   falls short, beats the best silhouette of ``split-reference-draws`` group-free Gaussian
   sets shaped like the updates (``clustering/null_reference.py``: the threshold that fits
   tens of clients is too high for hundreds of small ones, whose real groups score lower
   and whose noise scores lower still); otherwise the
   cluster stays whole and the refusal is logged in ``refused_splits`` (reason
   ``silhouette``) — it is proposed again in a later round while the criteria hold;
4. both children start from the cluster's (just aggregated) model and can split again;
5. **merging (choice, beyond the paper; ``merge = true``)**: two leaf clusters whose
   members' updates have become indistinguishable are merged (``leaf_merging.py``);
   it repairs over-split pure groups.

The side-based separation Gap is recorded for every split, never used as a veto (it is
negative for a pure split while a side still holds two groups).

Partial participation (``fraction-train`` < 1): the criteria (mean and max update
norm), the similarity matrix, the bi-partition and the acceptance test use the members
that replied this round (``min-split-size`` of them at least); the aggregate is theirs; a
client's summed updates (``similarity-decay``) run over the rounds it trained in. A member
of a splitting cluster that did not reply is put at once on the side whose mean its own
summed update on the decision layers is nearest to by cosine, or on the larger side if it
never replied (recorded under the split's ``absent``), so it keeps a model; when next
sampled it is placed for real by the newcomer descent from that split
(``tree_descent.py``). Merging, too, compares the clusters' repliers. With full
participation this is the paper's procedure. **Choice, beyond the paper (``similarity-pool =
members``, opt-in):** the similarity, the bi-partition, the acceptance test and the merge
tests use every member with a stored vector (the repliers' new ones, the others' last), the
criteria still the round's repliers: a tenth of a cluster's members can be too few to show
its groups, or to show that two leaves hold one.

The defaults of ``rel-eps1``, ``rel-eps2``, ``split-min-silhouette`` and
``split-silhouette-max-k`` were chosen from measured norm ratios and silhouettes of real SGD
updates: Sattler's absolute ``eps1``/``eps2`` never fire on small clients' updates, the
relative criteria fire on structured and, late in training, on iid clients alike, and the
best-cut silhouette separates the two (the measurements: docs/algorithms/cfl.md).
``split-min-silhouette = -1`` switches the test off. Every extension beyond the paper is a
``Params`` field, listed with the paper's rule and our default in docs/algorithms/cfl.md. The
shared tree, criteria and split log are in ``bipartitioning.py``; the parts CFL composes:
the per-client vectors (``client_vectors.py``), the newcomer descent (``tree_descent.py``),
merging (``leaf_merging.py``) and what a run says of its cluster count (``count_evidence.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from clusterfed.clustering.bipartition import SplitDecision, bipartition
from clusterfed.clustering.split_scores import (
    best_cut_silhouette,
    cosine_similarity_matrix,
    separation_gap,
    split_silhouette,
)
from clusterfed.clustering.layercfl import CheckResult
from clusterfed.clustering.null_reference import DEFAULT_DRAWS, reference_score, structure_threshold
from clusterfed.clustering.principal_scores import principal_scores
from clusterfed.strategies.bipartitioning import BiPartitioning, BiPartitioningParams, BiPartitioningState
from clusterfed.strategies.client_vectors import ClientVectors
from clusterfed.strategies.exchange import Diagnostics, SplitCompared, TrainReply, natural
from clusterfed.strategies.update_vectors import (
    check_record,
    decision_record,
    flatten,
    similarity_record,
    stack_float64,
)


# similarity-decay = auto: summed updates only for clients this small, where one round's
# update is mostly batch noise; for larger clients summing delayed the first pure split
# (benchmarks/results/small_client_defaults/README.md).
SMALL_CLIENT_EXAMPLES = 50
SMALL_CLIENT_DECAY = 0.8

# similarity-rank = auto (opt-in; default 0 = the paper's raw cosines): cosines of the updates'
# leading principal components, and a split must beat group-free updates, for clusters of at
# least this many repliers (below: raw cosines and the fixed threshold, set on tens of
# clients). With hundreds of small clients raw cosines of noisy updates show little
# structure, while a few components estimated from many rows hold the groups' differences
# (principal_scores.py) -- and any other structure of the updates: measured at 400 clients it
# recovered digit-pair groups better and over-split rotation groups (docs/algorithms/cfl.md)
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


class CFL(BiPartitioning):
    """CFL (Sattler et al.): recursive bi-partitioning on the cosine similarity of full updates."""

    name = "cfl"
    Params = CFLParams
    State = CFLState
    state: CFLState
    params: CFLParams
    one_cluster_reasons = {
        "criteria": "split criteria never met: the cluster was never both near-stationary "
                    "(mean-update norm < rel-eps1 × its peak) and heterogeneous (max norm > rel-eps2 × mean norm)",
        "silhouette": "every proposed split refused by the structure test: best-cut silhouette below split-min-silhouette "
                      "and below what group-free updates of the same size reach",
        "size": "too few members or replies to split (min-split-size) or the run ended before min-split-round",
    }

    @cached_property
    def vectors(self) -> ClientVectors:
        """The per-client vectors the similarity compares (``client_vectors.py``)."""
        return ClientVectors(self, sketch_dim=self.params.sketch_dim, seed=self.params.seed)

    def decision_names(self) -> list[str]:
        """The arrays whose updates the similarity is computed on: every compared array."""
        return self.state.compared

    def check_split(self, U: np.ndarray, side_a: np.ndarray, side_b: np.ndarray, S: np.ndarray) -> CheckResult | None:
        """CFL keeps every proposed split; LayerCFL adds its correct-clustering check."""
        return None

    def check_enforced(self) -> bool:
        """Whether a split failing ``check_split`` is refused (LayerCFL's ``correct-clustering-check``)."""
        return False

    # ------------------------------------------------------------ the round (module docstring)
    def after_train(self, server_round: int, replies: list[TrainReply]) -> Diagnostics:
        """Keep each replier's vector (step 2's input), then per cluster the criteria (step 1),
        the split (steps 2–4) and merging (step 5) (``BiPartitioning.after_train``)."""
        self.vectors.keep(replies, self.decision_names(), self.decay(), compact=self.compact_storage())
        # refused_splits: a column every round, [] when ``consider_split`` refused none
        return {"refused_splits": [], **super().after_train(server_round, replies)}

    def consider_split(self, server_round: int, cluster: int, replies: list[TrainReply],
                       decision: SplitDecision) -> Diagnostics | None:
        """Steps 2–4: a near-stationary, heterogeneous cluster of enough members is cut in two
        by complete linkage of its clients' cosine similarities, if the cut passes the
        acceptance test (and LayerCFL's check, when enforced)."""
        if not (decision.split and self.may_split(server_round, cluster, replies)):
            return
        # step 2: the similarity of the clients' vectors (similarity-pool, -decay, -rank) and two sides
        keys = self.similarity_pool(cluster, [r.key for r in replies])
        U = stack_float64([self.state.last_vector[k] for k in keys])
        rank = self.rank(len(keys))
        S = cosine_similarity_matrix(principal_scores(U, rank) if rank else U)
        side_a, side_b = bipartition(S)
        gap = separation_gap(S, side_a, side_b)
        silhouette = split_silhouette(S, side_a, side_b)
        # step 3: the acceptance test (beyond the paper): structure on 1 - S beyond what noise shows
        max_k = self.params.split_silhouette_max_k
        structure, structure_k = best_cut_silhouette(S, max_k) if max_k > 2 else (silhouette, 2)
        check = self.check_split(U, side_a, side_b, S)
        required, reference = self.required_structure(U, structure, max_k, rank)
        compared = SplitCompared(keys, S)
        record: dict[str, Any] = {
            "criterion": decision_record(decision),
            "gap": gap,
            "silhouette": silhouette,
            "best_cut_silhouette": structure,
            "best_cut_k": structure_k,
            "required_silhouette": required,
            "reference_silhouette": reference,
            "layers": self.decision_names(),
            "similarity_rank": rank,
        }
        sides = [[keys[i] for i in side_a], [keys[i] for i in side_b]]
        # a bi-partition of noise keeps the cluster whole; a cut must beat group-free data
        # strictly (updates that are all zero score 0, and so does their reference)
        if structure < required or (reference is not None and structure <= reference):
            self.refuse({"round": server_round, "cluster": cluster, "reason": "silhouette", "members": sides,
                         **record}, compared)
            return {"refused_splits": [{"cluster": cluster, "reason": "silhouette", "gap": gap,
                                        "silhouette": silhouette, "best_cut_silhouette": structure}]}
        if check is not None:
            record["check"] = check_record(check)
            if not check.passed and self.check_enforced():
                self.refuse({"round": server_round, "cluster": cluster, "reason": "check", "members": sides,
                             **record}, compared)
                return {"refused_splits": [{"cluster": cluster, "reason": "check", "gap": gap,
                                            "silhouette": silhouette, **record["check"]}]}
        # step 4: two children from the cluster's model; the model the members trained from this
        # round is what a newcomer replays the split on
        keys_a, keys_b = sides
        route = {"rule": "nearest-mean", "names": self.decision_names(), "model": replies[0].sent,
                 "directions": [U[side_a].mean(axis=0), U[side_b].mean(axis=0)],
                 **({"sketch": self.state.sketch} if self.state.sketched and self.state.sketch is not None else {})}
        absent = [k for k in self.state.tree.members(cluster) if k not in set(keys)]
        extra_a, extra_b = self.descent.place_absent(cluster, absent, route, self.state.last_vector,
                                                     (len(keys_a), len(keys_b)))
        record["absent"] = [extra_a, extra_b]
        record["similarity"] = similarity_record(keys, S)
        summary = self.apply_split(server_round, cluster, keys_a + extra_a, keys_b + extra_b, record, route, compared)
        return {"splits": [summary]}

    def refuse(self, record: dict[str, Any], compared: SplitCompared) -> None:
        """Log a refused split; reported for scoring like a split."""
        self.state.refused.append(record)
        compared.records.append(record)
        self.reports.append(compared)

    # ------------------------------------------------------------ extensions beyond the paper
    def similarity_pool(self, cluster: int, repliers: list[str]) -> list[str]:
        """The clients a split of ``cluster``, or a merge, is judged on (``similarity-pool``): its repliers, then,
        with ``members``, every other member with a stored update in key order. Under partial
        participation a round's sample of a cluster can be too small to show its groups
        (a tenth of a cluster of 200 is 20 updates), while every member that trained since
        the run began has left its summed update (``similarity-decay``)."""
        if self.params.similarity_pool == "repliers":
            return repliers
        replied = set(repliers)
        last = self.state.last_vector
        return repliers + sorted((k for k in self.state.tree.members(cluster) if k not in replied and k in last),
                                 key=natural)

    def decay(self) -> float:
        """``similarity-decay``; ``auto``: 0.8 for small clients (the median client of those
        known holds fewer than ``SMALL_CLIENT_EXAMPLES`` examples), 0 (the paper) otherwise."""
        decay = self.params.similarity_decay
        if decay != "auto":
            return float(decay)
        sizes = [info.num_examples for info in self.clients.values()]
        return SMALL_CLIENT_DECAY if sizes and float(np.median(sizes)) < SMALL_CLIENT_EXAMPLES else 0.0

    def rank(self, replies: int) -> int:
        """``similarity-rank`` for a cluster of ``replies`` repliers (0: raw cosines)."""
        rank = self.params.similarity_rank
        if rank == "auto":
            return PRINCIPAL_RANK if replies >= PRINCIPAL_MIN_REPLIES else 0
        return int(rank)

    def required_structure(self, U: np.ndarray, structure: float, max_k: int,
                           rank: int = 0) -> tuple[float, float | None]:
        """The best-cut silhouette a split needs: ``split-min-silhouette``, lowered to what
        group-free updates of this size and shape reach when the cut falls short of it
        (``null_reference``), and that reference score (None when not drawn). On principal
        components (``rank`` > 0) the reference is always drawn and is the threshold: the
        fixed one was set on raw cosines, and a few components of noise cut well too."""
        fixed = self.params.split_min_silhouette
        if (structure >= fixed and not rank) or self.params.split_reference_draws <= 0:
            return fixed, None

        def score(R: np.ndarray) -> float:
            S = cosine_similarity_matrix(principal_scores(R, rank) if rank else R)
            return best_cut_silhouette(S, max_k)[0] if max_k > 2 else split_silhouette(S, *bipartition(S))

        reference = reference_score(U, score, draws=self.params.split_reference_draws, seed=self.params.seed)
        if rank:
            return (fixed if reference is None else reference), reference
        return structure_threshold(fixed, reference), reference

    # ------------------------------------------------------------ merging (step 5)
    def merge_names(self) -> list[str]:
        return self.decision_names()

    def merge_vectors(self, groups: dict[int, list[TrainReply]], names: list[str]) -> dict[int, np.ndarray]:
        """With ``similarity-pool = members``, each replying cluster's pool (``similarity_pool``) of stored
        vectors; else the repliers' updates."""
        if self.params.similarity_pool == "repliers":
            return super().merge_vectors(groups, names)
        return {c: stack_float64([self.state.last_vector[k] for k in self.similarity_pool(c, [r.key for r in g])])
                for c, g in sorted(groups.items())}

    # ------------------------------------------------------------ what a run says of its count
    def refusal_codes(self) -> list[str]:
        return [r["reason"] for r in self.state.refused]

    def split_score(self, split: dict[str, Any]) -> tuple[str, float, float] | None:
        if split.get("best_cut_silhouette") is None or split.get("required_silhouette") is None:
            return None
        return "best-cut silhouette", split["best_cut_silhouette"], split["required_silhouette"]

    def refusal_numbers(self) -> str | None:
        """The refusal closest to passing, of the most frequent reason: the best-cut silhouette
        against the one required, or (LayerCFL's check) γ_max against its bound."""
        codes = self.refusal_codes()
        if not codes:
            return None
        top = max(set(codes), key=codes.count)
        refused = self.state.refused
        if top == "check":
            r = min((r for r in refused if r["reason"] == "check"),
                    key=lambda r: r["check"]["gamma_max"] - r["check"]["bound"])
            return (f"closest refusal: round {r['round']}, cluster {r['cluster']}: estimated γ_max "
                    f"{r['check']['gamma_max']:.3f} >= bound {r['check']['bound']:.3f}")
        r = max((r for r in refused if r["reason"] == top),
                key=lambda r: r["best_cut_silhouette"] - r["required_silhouette"])
        basis = (f"group-free reference {r['reference_silhouette']:.3f}" if r.get("reference_silhouette") is not None
                 else f"split-min-silhouette {self.params.split_min_silhouette}")
        compared = len(r["members"][0]) + len(r["members"][1])
        who = "clients compared" if self.params.similarity_pool == "members" else "repliers"
        return (f"closest refusal: round {r['round']}, cluster {r['cluster']} ({compared} {who}): "
                f"best-cut silhouette {r['best_cut_silhouette']:.3f} < required "
                f"{r['required_silhouette']:.3f} ({basis})")

    def cluster_state(self) -> dict[str, Any]:
        state = super().cluster_state()
        state["refused_splits"] = self.state.refused
        return state
