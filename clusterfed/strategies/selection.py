"""Adaptive cluster-count client selection (Chen and Chen, "An Adaptive Clustering Scheme
for Client Selections in Communication-efficient Federated Learning"): one global model,
trained FedAvg-style, but after a warm-up each round only one representative client per
cluster trains, which cuts the transmissions. The paper gives its scheme as steps, not numbered
pseudo-code; steps 1–3 below are its steps (our choices marked), step 4 an extension (``guard``).

1. ``warmup-rounds`` rounds with every client; the server keeps each client's latest
   local model (its ``final`` layer) and loss. What is clustered is the final layer's
   latest *change* (local model minus the global model the client started from): the
   latest models of clients that last trained in different rounds differ mostly by how
   far the global model has moved since, which would cluster stale against fresh
   clients rather than by data. (choice: ``cluster-on``; ``weights`` is the paper's)
2. Every later round the clients' latest final layers are clustered (agglomerative,
   ``linkage``, L2) into exactly ``p`` groups; one random client per group trains the
   global model; the global model is the ``n_c``-weighted average of their models, and
   their latest models are replaced.
3. ``p`` starts at the number of clients and follows the TCP-like rule of
   ``clustering.cluster_count`` on the loss-reduction ratio of the mean participant
   training loss (``w``, doubling step ``d``, ``hold-rounds``, ``stabilizer``).
4. ``guard = "floor"`` (the default; choice, beyond the paper): after each warm-up round
   the clients' final-layer changes (every client trained from the same global model) are
   cut where the silhouette is best (``cluster_auto``; one group when no cut shows
   structure, every client its own group with fewer than 3); the warm-up goes on past
   ``warmup-rounds`` until two successive rounds' cuts agree (``clustering.reproducible``),
   ``warmup-max`` rounds at most (then the last cut stands). Every later round draws one
   representative from each of these groups (a client that joins later goes to the group
   whose mean warm-up change is nearest its latest change), weighted by its group's
   samples instead of its own, so each round gives every group the weight FedAvg gives it.
   The number of groups is the floor; the rule still runs (``p_rule``) but only between 1
   and the floor, so the cut is the floor. Why: below it one client's data trains the
   global model alone (its own loss keeps falling, so the rule keeps p there while the
   model forgets the other groups); above it the rule's doublings follow stalls of a
   noisy mean loss, not a missing group; later rounds' latest changes mix clients that
   last trained in different rounds, and their cuts stopped matching the groups.
   ``guard = "none"`` is the paper's rule: p starts at the number of clients and may fall
   to 1; the cut into p groups is made anew every round.
   Opt-in, off by default (tried on the seeds that fall short at 60 rounds, not adopted:
   docs/algorithms/selection.md, "Seed by seed"): ``group-step = "latest"`` steps each group
   by the sample-weighted mean of its members' latest changes (the representative's fresh,
   the others' kept from when they last trained; a kept change older than twice the group's
   size in rounds is left out), ``draw = "oldest"`` draws the member that trained longest
   ago, ``budget`` > 0 spends the transmissions left under that share of FedAvg's on full
   rounds (every reachable client trains, as in the warm-up).
5. ``ClientSelection.paper()`` (run config ``preset = "paper"``): ``guard = "none"`` and
   ``cluster-on = "weights"`` (``PAPER``): the paper's scheme with none of the extensions above.

Partial participation (``fraction-train`` < 1): the paper's selection *is* its client
sampling, so ``fraction-train`` is read as availability — each round only a random
``fraction-train`` sample of the clients can be reached (cross-device FL). The warm-up
trains the reachable clients; afterwards the cut into ``p`` groups is still over every
client's latest final layer (the paper's), and each group's representative is drawn
among its reachable members; a group with none reachable does not train this round, and a
reachable client with no latest model yet trains too. With ``fraction-train = 1`` every
client is reachable: the paper's scheme.

rounds.jsonl records, every round: ``p`` (the cut used), ``p_rule`` (the rule's own p),
``p_floor``, ``p_next``, the rule's action,
the ratio, the representatives and ``models_exchanged`` (models sent down plus models
sent up: 2 per trained client; the runner's ``transmissions`` counts the replies).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from pydantic import Field

from clusterfed.strategies import base
from clusterfed.clustering import (ClusterCountController, cluster_auto, cluster_into_k, cluster_references,
                                   loss_reduction_ratio, nearest_cluster)
from clusterfed.clustering.reproducible import DEFAULT_AGREEMENT, compare
from clusterfed.strategies.base import ClusteredState, ClusteredStrategy, StrategyParams, mean_train_loss
from clusterfed.core.exchange import Diagnostics, Round, Trainers, TrainReply, natural


class SelectionParams(StrategyParams):
    warmup_rounds: int = Field(1, alias="warmup-rounds", ge=0, description="rounds in which every client trains")
    w: float = Field(0.01, ge=0, description="loss-reduction ratio above which p decreases")
    hold_rounds: int = Field(2, alias="hold-rounds", ge=0, description="rounds p is held after a change")
    stabilizer: Literal["none", "annealing", "experience"] = Field("none", description="the paper's p stabilisers")
    anneal_tau: float = Field(50.0, alias="anneal-tau", gt=0,
                              description="annealing: keep p with probability 1 - exp(-round / anneal-tau)")
    linkage: Literal["average", "single", "complete", "ward"] = Field(
        "average", description="linkage of the cut into p groups")
    cluster_on: Literal["changes", "weights"] = Field(
        "changes", alias="cluster-on",
        description="what is clustered of each client's final layer: its latest change (local model minus the "
                    "global model it started from) or its latest weights (the paper's)")
    warmup_max: int = Field(
        10, alias="warmup-max", ge=0,
        description="guard = floor: the warm-up goes on past warmup-rounds until the cut of two successive "
                    "warm-up rounds agrees, for at most this many rounds in all")
    group_step: Literal["fresh", "latest"] = Field(
        "fresh", alias="group-step",
        description="guard = floor: each group's step in the global model: the drawn representative's change "
                    "alone (fresh) or the sample-weighted mean of every member's latest change, the "
                    "representative's fresh and the others' kept from the last time they trained (latest)")
    draw: Literal["random", "oldest"] = Field(
        "random", description="guard = floor: which reachable member of a group represents it: a random one (the "
                              "paper's) or the one that trained longest ago (ties at random)")
    budget: float = Field(
        0.0, ge=0, le=1,
        description="guard = floor: the share of FedAvg's transmissions (every active client every round) the "
                    "run may spend; a round after the warm-up in which every reachable client's reply still "
                    "fits in that share is a full round (every reachable client trains, as in the warm-up) "
                    "instead of one representative per group; 0: representatives only")
    guard: Literal["none", "floor"] = Field(
        "floor", description="none: the paper's rule (p starts at the number of clients and may fall to 1: one "
                             "client then trains the global model); floor: one representative, weighted by its "
                             "group's samples, from each group of the silhouette-best cut of the warm-up's "
                             "final-layer changes (the rule runs below that number)")


@dataclass
class SelectionState(ClusteredState):
    layer_keys: list[str] = field(default_factory=list)
    latest: dict[str, np.ndarray] = field(default_factory=dict)  # client -> its latest final layer, flattened
    previous_loss: float | None = None
    controller: ClusterCountController | None = None
    transmissions: int = 0
    floor: int = 1  # groups the warm-up's clustering showed (guard = "floor")
    groups: dict[str, int] = field(default_factory=dict)  # guard = "floor": client -> its warm-up group
    group_refs: dict[int, np.ndarray] = field(default_factory=dict)  # warm-up group -> mean change (newcomers)
    examples: dict[str, int] = field(default_factory=dict)  # client -> samples of its latest reply
    stands_for: dict[str, int] = field(default_factory=dict)  # this round's representative -> its group's samples
    settled: bool = False  # guard = "floor": the warm-up's cut reproduced in two successive rounds (or ran out)
    warmup_cut: dict[str, int] = field(default_factory=dict)  # the last warm-up round's cut (client -> group)
    warmup_agreement: list[dict] = field(default_factory=list)  # per warm-up round: the rounds compared, ARI
    # group-step = latest: client -> its latest change of every array (float32) and the round it trained
    # (defaults: a checkpoint written before these fields resumes with an empty memory)
    updates: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    trained_round: dict[str, int] = field(default_factory=dict)
    fedavg_models: int = 0  # models FedAvg would have exchanged so far (2 per active client per round): budget
    full_round: int = 0  # the last round that was a full round (budget); 0: none


class ClientSelection(ClusteredStrategy):
    """Adaptive cluster-count client selection: one representative per cluster trains."""
    secure_refusal = base.READS_EACH_CLIENTS_MODEL  # secure aggregation refused before any message

    name = "selection"
    Params = SelectionParams
    State = SelectionState
    # the paper's rule: p from the number of clients, free to fall to 1, cut anew every round
    # over the clients' latest final-layer weights
    PAPER = {"guard": "none", "cluster_on": "weights", "group_step": "fresh", "draw": "random", "budget": 0.0}
    params: SelectionParams
    state: SelectionState
    figures = ("p_history",)

    def init_clusters(self) -> None:
        super().init_clusters()
        self.state.layer_keys = self.select_compared_layers("final")
        self.state.latest = {}
        self.state.previous_loss = None
        self.state.controller = None
        self.state.transmissions = 0
        self.state.floor, self.state.groups, self.state.group_refs = 1, {}, {}
        self.state.examples, self.state.stands_for = {}, {}
        self.state.settled, self.state.warmup_cut, self.state.warmup_agreement = self.params.guard != "floor", {}, []
        self.state.updates, self.state.trained_round = {}, {}
        self.state.fedavg_models, self.state.full_round = 0, 0

    def warming_up(self, server_round: int) -> bool:
        """Whether every reachable client trains this round: the warm-up rounds, and any round
        before a client's latest model is known. Read before the round's replies are remembered."""
        if server_round <= self.params.warmup_rounds or self.state.controller is None and not self.state.latest:
            return True
        # guard = "floor": until the warm-up's cut reproduces (or warmup-max rounds ran)
        return not self.state.settled and self.state.controller is None and server_round <= self.params.warmup_max

    def select_trainers(self, rnd: Round) -> Trainers:
        """Warm-up: every reachable client; afterwards one representative per group
        (``representatives``). What the choice found (p, the representatives, the models
        exchanged) is the round's record."""
        warmup = self.warming_up(rnd.number)
        self.state.fedavg_models += 2 * len(rnd.active)
        full = False
        if warmup:
            trainers, p, diagnostics = rnd.reachable(self.placed(rnd)), None, {}
        else:
            trainers, p, diagnostics = self.representatives(rnd)
            everyone = rnd.reachable(self.placed(rnd))
            if self.spare(len(everyone)) and len(everyone) > len(trainers):
                full, trainers = True, everyone
                self.state.full_round = rnd.number
        self.state.transmissions += 2 * len(trainers)
        return Trainers(trainers, {**diagnostics, "p": p, "representatives": [] if warmup or full else trainers,
                                   "warmup": warmup, "full_round": full, "trained_clients": len(trainers),
                                   "models_exchanged": 2 * len(trainers),
                                   "cum_models_exchanged": self.state.transmissions})

    def aggregate(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        """The global model: the representatives' models weighed as ``group_weighted`` says
        (the warm-up: every client by its own samples)."""
        if self.warming_up(rnd.number) or self.state.full_round == rnd.number:
            return self.aggregate_clusters(replies)
        if self.keeps_updates():
            replies, kept = self.group_latest(rnd, replies)
            return {**self.aggregate_clusters(replies), "kept_changes": len(kept),
                    "kept_oldest_round": min(kept.values(), default=None)}
        return self.aggregate_clusters(self.group_weighted(replies))

    def spare(self, replies: int) -> bool:
        """budget: whether ``replies`` more replies (2 models each) keep the run's models
        exchanged within ``budget`` of FedAvg's so far (guard = floor, after the warm-up)."""
        if self.params.guard != "floor" or self.params.budget <= 0:
            return False
        return self.state.transmissions + 2 * replies <= self.params.budget * self.state.fedavg_models

    def keeps_updates(self) -> bool:
        """group-step = latest applies: guard = floor, and no differential privacy (a kept change
        would go into more than one release)."""
        return self.params.guard == "floor" and self.params.group_step == "latest" and self.dp is None

    def group_latest(self, rnd: Round, replies: list[TrainReply]) -> tuple[list[TrainReply], dict]:
        """group-step = latest: each group that trained this round steps by the sample-weighted
        mean of its members' latest changes — the representative's fresh one, every other
        member's from the last time it trained (applied to the current global model) — so a
        round's step is not one member's data alone (meant to damp the round-to-round swing of
        one representative per group; on seeds 5 and 6 of the per-seed benchmark it did not,
        hence opt-in). A kept change older than twice its group's size in rounds is left out (a
        member that stopped replying). Returns the replies to average (the representatives' and
        the kept ones, each weighed by its own samples: the groups' weights are FedAvg's) and
        what was kept (client -> the round it trained)."""
        model = self.state.models[0]
        fresh = {r.key for r in replies}
        sizes = Counter(self.state.groups.values())
        trained_groups = {self.state.groups.get(k) for k in fresh}
        out, kept, active = list(replies), {}, set(rnd.active)
        for key in sorted(self.state.updates, key=natural):
            group = self.state.groups.get(key)
            if key in fresh or group is None or group not in trained_groups or key not in active:
                continue
            age = rnd.number - self.state.trained_round.get(key, 0)
            if age > 2 * sizes.get(group, 1):
                continue
            out.append(TrainReply(key=key, cluster=0, arrays=self.state.updates[key], sent=model,
                                  num_examples=self.state.examples.get(key, 0), train_loss=None, metrics={},
                                  is_update=True))
            kept[key] = self.state.trained_round.get(key, 0)
        return out, kept

    def after_train(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        """The trainers' latest models replace theirs (the warm-up's groups are learnt from
        them); p follows the rule on the mean training loss's reduction ratio."""
        warmup = self.warming_up(rnd.number)  # before ``remember``: as the round found the state
        first = not self.state.examples
        self.remember(replies, rnd.number)
        diagnostics: Diagnostics = {}
        if warmup:
            diagnostics = self.learn_groups(rnd.number)
        if first and replies:
            diagnostics["decision"] = "; ".join(w for w in (self.compares_words(), diagnostics.get("decision")) if w)
        loss = mean_train_loss(replies)
        ratio = loss_reduction_ratio(self.state.previous_loss, loss)
        if not warmup:
            p_next = self.count_controller(len(rnd.active)).update(ratio, rnd.number)
            diagnostics = {"p_next": p_next, "p_action": self.state.controller.history[-1].action}
        if loss is not None:
            self.state.previous_loss = loss
        return {**diagnostics, "loss_reduction_ratio": ratio}

    def draw_sample(self, rnd: Round) -> list[str] | None:
        """``fraction-train`` is availability: the clients reachable this round."""
        return self.sample_active(rnd)

    def compares_words(self) -> str:
        """Round 1's words on what ClientSelection compares."""
        what = "change (local model minus the global model)" if self.params.cluster_on == "changes" else "weights"
        then = ("the warm-up's groups (the silhouette-best cut, once two successive warm-up rounds agree) give one "
                "representative each per round" if self.params.guard == "floor" else
                "they are cut into p groups every round, one representative each")
        return (f"ClientSelection compares the clients' latest final-layer {what} ({', '.join(self.state.layer_keys)}) "
                f"by L2, {self.params.linkage} linkage; {then}")

    def count_controller(self, active: int) -> ClusterCountController:
        """The rule's p controller, made on first use (``active``: the round's number of active clients)."""
        if self.state.controller is None:
            # guard = "floor": the rule's p lives in [1, floor] (starting at the floor) and the
            # cut never goes below the floor, so the cut is the groups the warm-up showed
            top = max(active, 1) if self.params.guard == "none" else max(self.state.floor, 1)
            self.state.controller = ClusterCountController(
                m=top, w=self.params.w, hold_rounds=self.params.hold_rounds,
                stabilizer=self.params.stabilizer, rng=self.state.rng, anneal_tau=self.params.anneal_tau)
            self.state.controller.set_floor(self.state.floor)
        return self.state.controller

    def learn_groups(self, server_round: int) -> Diagnostics:
        """guard = "floor": the groups of the silhouette-best cut of the clients' latest
        final-layer changes (every client its own group with fewer than 3: no cut to score);
        ``floor`` is their number (1 with guard = "none"). The warm-up is settled once this
        round's cut and the last warm-up round's agree on the clients both cut (ARI at least
        ``DEFAULT_AGREEMENT``, ``clustering.reproducible``; successive rounds are independent
        draws of the clients' training), or at ``warmup-max`` rounds, when the last cut stands.
        Returns the diagnostics (the agreement, and the round line's words)."""
        keys = sorted(self.state.latest, key=natural)
        if self.params.guard != "floor" or not keys:
            self.state.floor = 1
            return {}
        X = np.stack([self.state.latest[k] for k in keys], dtype=np.float64)
        labels = (np.arange(len(keys)) if len(keys) < 3 else
                  cluster_auto(X, metric="l2", linkage=self.params.linkage).labels)
        cut = {k: int(label) for k, label in zip(keys, labels)}
        self.state.groups = dict(cut)
        self.state.group_refs = cluster_references(X, labels)
        self.state.floor = len(self.state.group_refs)
        common = [k for k in keys if k in self.state.warmup_cut]
        words, record = None, {}
        if len(common) >= 2:
            evidence = compare([cut[k] for k in common], [self.state.warmup_cut[k] for k in common],
                               f"the warm-up's cuts of rounds {server_round - 1} and {server_round}")
            record = {"round": server_round, **evidence.as_record()}
            self.state.warmup_agreement.append(record)
            if evidence.reproduces(DEFAULT_AGREEMENT):
                self.state.settled = True
                words = (f"ClientSelection: {self.state.floor} groups, one representative each from now on: "
                         f"{evidence.words(DEFAULT_AGREEMENT)}")
            elif server_round >= max(self.params.warmup_max, self.params.warmup_rounds):
                self.state.settled = True
                words = (f"ClientSelection: warm-up ends at warmup-max = {self.params.warmup_max} rounds with "
                         f"{self.state.floor} groups, not reproduced: {evidence.words(DEFAULT_AGREEMENT)}")
            else:
                words = (f"ClientSelection: warm-up goes on (every client trains): "
                         f"{evidence.words(DEFAULT_AGREEMENT)}")
        elif server_round >= max(self.params.warmup_max, self.params.warmup_rounds):
            self.state.settled = True
        self.state.warmup_cut = cut
        out: Diagnostics = {"p_floor": self.state.floor}
        if record:
            out["warmup_agreement"] = record
        if words:
            out["decision"] = words
        return out

    def group_of(self, key: str) -> int:
        """A client's warm-up group; one that joined later goes to the group whose mean
        warm-up change is nearest its latest change."""
        if key not in self.state.groups:
            change = np.asarray(self.state.latest[key], dtype=np.float64)
            self.state.groups[key] = nearest_cluster(change, self.state.group_refs)[0]
        return self.state.groups[key]

    def representatives(self, rnd: Round) -> tuple[list[str], int, Diagnostics]:
        """Cut the clients' latest final layers into exactly p groups (guard = "floor": the
        warm-up's groups); one random reachable client per group (a group with none reachable
        sits the round out). Reachable clients with no latest model yet (newcomers) train too.
        Returns them, p, and the diagnostics (the rule's p and the floor)."""
        known = sorted((k for k in self.placed(rnd) if k in self.state.latest), key=natural)
        reachable = set(rnd.reachable(known))
        fresh = [k for k in rnd.reachable(self.placed(rnd)) if k not in self.state.latest]
        chosen, p, diagnostics = [], 0, {}
        self.state.stands_for = {}
        if known:
            X = np.stack([self.state.latest[k] for k in known], dtype=np.float64)
            controller = self.count_controller(len(rnd.active))
            p = min(controller.set_floor(self.state.floor), len(known))
            diagnostics = {"p_rule": controller.p, "p_floor": controller.floor}
            if self.params.guard == "floor":  # the warm-up's groups: later changes mix stale and fresh
                labels = np.array([self.group_of(k) for k in known])
            else:
                labels = cluster_into_k(X, p, metric="l2", linkage=self.params.linkage)
            groups = 0
            for label in np.unique(labels):
                group = [k for k, lab in zip(known, labels) if lab == label]
                members = [k for k in group if k in reachable]
                groups += 1
                if members:
                    if self.params.guard == "floor" and self.params.draw == "oldest":
                        # the member that trained longest ago (ties at random): every member in turn
                        oldest = min(self.state.trained_round.get(k, 0) for k in members)
                        members = [k for k in members if self.state.trained_round.get(k, 0) == oldest]
                    chosen.append(members[int(self.state.rng.integers(len(members)))])
                    self.state.stands_for[chosen[-1]] = sum(self.state.examples.get(k, 0) for k in group)
            # SciPy never splits a tie, so a cut may have fewer than p groups: top up at random
            rest = [k for k in known if k not in chosen and k in reachable]
            missing = min(p - groups, len(rest))
            extra = self.state.rng.choice(len(rest), size=missing, replace=False) if missing > 0 else []
            chosen += [rest[int(i)] for i in extra]
        return sorted(chosen + fresh, key=natural), p, diagnostics

    def group_weighted(self, replies: list[TrainReply]) -> list[TrainReply]:
        """guard = "floor": each representative's model weighs as much as the samples of the
        group it stands for (the paper: its own samples), so every round's average gives each
        group the weight FedAvg gives it, whichever member was drawn."""
        if self.params.guard != "floor":
            return replies
        return [replace(r, num_examples=self.state.stands_for.get(r.key) or r.num_examples) for r in replies]

    def remember(self, replies: list[TrainReply], server_round: int = 0) -> None:
        keep = self.keeps_updates()
        for reply in replies:
            self.state.examples[reply.key] = int(reply.num_examples)
            self.state.trained_round[reply.key] = server_round
            if keep:  # float32 as sent (integer arrays in their own dtype)
                self.state.updates[reply.key] = {n: np.asarray(v) for n, v in reply.update.items()}
            arrays = reply.update if self.params.cluster_on == "changes" else reply.weights
            # in the arrays' own dtype (float32 as clients send them: half the memory of a float64
            # copy, and the float64 stacks they are read into hold the same numbers)
            self.state.latest[reply.key] = np.concatenate([arrays[n].ravel() for n in self.state.layer_keys])

    def cluster_state(self) -> dict:
        history = self.state.controller.history if self.state.controller else []
        return {"p_history": [{"round": s.round, "p": s.p, "p_rule": s.rule_p, "floor": s.floor, "d": s.d,
                               "action": s.action, "ratio": s.ratio} for s in history],
                "transmissions": self.state.transmissions}
