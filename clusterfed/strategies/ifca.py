"""IFCA (Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020): ``num-clusters`` K cluster models; every round each sampled
client receives all K, keeps the one with the lowest loss on its *training* data, trains
it and returns it with the chosen index; FedAvg per cluster over the clients that chose it.
That is the paper's Algorithm 1 in its model-averaging form: the cluster identity estimate
(``train``: every model offered, the reply's choice kept), the local update (the client's own
training) and the per-cluster average (``aggregate``).

- The K models travel in one message (array ``name`` of model k as ``m{k}.{name}``, config
  ``ifca-k`` = K), so the downlink counted is K models per trained client. The reply holds
  the chosen model's arrays under the plain names and the metric ``ifca-choice``; the
  runner validates those arrays against the model sent at that index.
- ``ifca-init = random``: K independent, seeded initialisations (``clustering.ifca``).
  ``ifca-init = kmeans++``: round 1 is a warm-up in which the sampled clients train θ0; the
  K cluster models are k-means++ seeds among their flattened models, and each warm-up
  client provisionally belongs to its nearest seed until it chooses by loss.
- ``ifca-restarts = R > 1``: with ``random``, round 1 is run from R initialisations (R
  rounds of traffic, all counted) and the one whose clients' mean training loss is lowest
  is kept; with ``kmeans++``, R seedings and the lowest k-means potential. (choice: the
  paper restarts whole runs; restarting the first round keeps it inside one run)
- ``reseed-after = R`` (default 2; choice, beyond the paper): a model that wins no client for
  R rounds in a row is re-seeded from a cluster that holds two groups: each cluster's members
  that trained in it this round and the last are cut in two by their updates, once per round
  (``clustering.ifca.split_evidence``); when the cuts agree (``clustering.reproducible``), the
  idle model becomes the mean trained model of the side with the higher mean training loss.
  No such cluster: the model stays. The round line says which (``reseed``). ``0``: never.
- ``IFCA.paper()`` (run config ``preset = "paper"``): random initialisations, no restart, no
  re-seeding (``PAPER``), the paper's Algorithm 1 as this module runs it.
- A client is evaluated with the model it chose last; a client that has not trained yet
  (a newcomer) is not evaluated until it has chosen, which it does by loss like everyone.

Partial participation (``fraction-train`` < 1): as in the paper, each round a random
``fraction-train`` sample of all clients receives the K models, and each sampled client
chooses and trains; FedAvg per cluster over the sample's choices (a model chosen by nobody
keeps its weights). A client keeps its last choice between the rounds it is sampled; one
never sampled yet has no cluster and is not evaluated until its first choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from clusterfed.clustering.ifca import (compares_words, flat, kmeanspp_seeds, nearest_seed, random_initialisations,
                                       split_evidence)
from clusterfed.clustering.reproducible import DEFAULT_AGREEMENT
from clusterfed.strategies.base import (MULTI_MODEL, ClusteredState, ClusteredStrategy, Steps, StrategyParams,
                                        mean_train_loss)
from clusterfed.protocol import CHOOSE_PHASE
from clusterfed.core.exchange import CHOICES, Arrays, Ask, ClientInfo, Diagnostics, Round, TrainReply, natural, pack_models


class IFCAParams(StrategyParams):
    num_clusters: int = Field(4, alias="num-clusters", ge=1, description="K cluster models")
    init: Literal["random", "kmeans++"] = Field(
        "random", json_schema_extra={"legacy": "ifca-init"}, description="K seeded random models, or k-means++ seeds among the clients' models after a warm-up round")
    restarts: int = Field(1, json_schema_extra={"legacy": "ifca-restarts"}, ge=1, le=20, description="initialisations tried in the first round (random) or seedings (kmeans++)")
    reseed_after: int = Field(
        2, alias="reseed-after", ge=0,
        description="a cluster model that wins no client for this many rounds in a row is re-seeded from the "
                    "worse-fitting side of a cluster whose members' updates split the same way in two successive "
                    "rounds (0: never, the paper's)")

    @model_validator(mode="after")
    def _no_individual_seeds_under_secure_aggregation(self) -> "IFCAParams":
        if self.init == "kmeans++" and self.secagg is not None:
            raise ValueError("init = 'kmeans++' makes cluster models of individual clients' trained models (the "
                             "warm-up uploads them in the clear and serves them to everyone); with "
                             "secure_aggregation use init = 'random'")
        return self

    @model_validator(mode="after")
    def _no_unnoised_seeds_under_dp(self) -> "IFCAParams":
        if self.init == "kmeans++" and self.dp is not None:
            raise ValueError("init = 'kmeans++' makes cluster models of individual clients' trained models, released "
                             "without noise; with the dp_* parameters use init = 'random'")
        return self


@dataclass
class IFCAState(ClusteredState):
    k: int = 0
    warming_up: bool = False
    choice_counts: dict[int, int] = field(default_factory=dict)
    candidates: list[list[Arrays]] = field(default_factory=list)
    idle: dict[int, int] = field(default_factory=dict)  # model -> rounds in a row it won no client
    last_won: dict[int, int] = field(default_factory=dict)  # model -> the last round it won a client
    reseeds: list[dict] = field(default_factory=list)  # every re-seed: round, model, from cluster, clients, ARI
    # the last round's cluster and update row (compared arrays) per trained client: ``reseed``'s evidence
    previous_cluster: dict[str, int] = field(default_factory=dict)
    previous_update: dict[str, np.ndarray] = field(default_factory=dict)
    seeded_round: int = 0  # init = kmeans++: the warm-up round whose models seeded the K


class IFCA(ClusteredStrategy):
    """IFCA: every sampled client trains the lowest-loss of the K models."""

    name = "ifca"
    Params = IFCAParams
    State = IFCAState
    # the paper's random initialisations, no restart inside a run, no re-seeding
    PAPER = {"init": "random", "restarts": 1, "reseed_after": 0}
    params: IFCAParams
    state: IFCAState
    one_cluster_reasons = {
        "one_choice": "every client's lowest-training-loss model was the same one: the other models never won a "
                      "client (try init = \"kmeans++\" or more restarts)",
    }

    def requires(self) -> set[str]:
        return {MULTI_MODEL}

    def init_clusters(self) -> None:
        self.state.k = self.params.num_clusters
        self.state.warming_up = self.params.init == "kmeans++"
        self.state.choice_counts = {}
        self.state.idle, self.state.last_won, self.state.reseeds = {}, {}, []
        self.state.previous_cluster, self.state.previous_update = {}, {}
        if self.state.warming_up:
            self.new_cluster(self.state.theta0)  # the warm-up model, replaced by the seeds
            return
        self.state.candidates = [
            random_initialisations(self.state.theta0, self.state.k, self.state.rng, self.compared_names())
            for _ in range(self.params.restarts)]
        for model in self.state.candidates[0]:
            self.new_cluster(model)

    def select_trainers(self, rnd: Round) -> list[str]:
        # everyone active may be sampled: a client is placed by its own first choice
        return self.sample(list(rnd.active), self.params.fraction_train, self.params.min_train_nodes)

    def admit(self, rnd: Round, keys: list[str]) -> None:
        """Nothing to do: a newcomer chooses its cluster by loss when it first trains."""

    def ifca_asks(self, rnd: Round, keys: list[str], models: dict[int, dict]) -> list[Ask]:
        packed = pack_models([models[c] for c in range(self.state.k)])
        asks = []
        for key in keys:
            config = {"server-round": rnd.number, "phase": "train", "upload": "full", "return": "weights",
                      "cluster-id": -1, CHOICES: self.state.k}
            asks.append(Ask(key, packed, config))
        return asks

    def train(self, rnd: Round, trainers: list[str]) -> Steps:
        """The paper's round: each trainer is offered all K models, trains the one of lowest
        loss on its training data and belongs to the cluster it chose. First round with
        ``restarts`` > 1 (random): once per initialisation, keeping the best; kmeans++'s
        warm-up: the trainers train θ0 (``aggregate`` seeds the K models from them)."""
        if self.state.warming_up:
            replies = yield self.train_asks(rnd, trainers, models={k: self.state.theta0 for k in trainers},
                                            extra={"cluster-id": 0}, phase="warmup")
            return replies, {}
        restarts = self.state.candidates or []
        if len(restarts) > 1:
            replies, diagnostics = yield from self.restart(rnd, trainers, restarts)
        else:
            replies, diagnostics = (yield self.ifca_asks(rnd, trainers, self.state.models)), {}
        self.state.candidates = []
        for reply in replies:  # each replying client belongs to the cluster it chose
            self.state.assignment[reply.key] = reply.cluster
        return replies, diagnostics

    def secure_train(self, rnd: Round, trainers: list[str]) -> Steps:
        """The round under secure aggregation: a choice step (each trainer is offered the K
        models and says which has the lowest loss on its training data, training nothing and
        uploading no arrays: ``protocol.CHOOSE_PHASE``), then one SecAgg+ instance per chosen
        model among the clients that chose it, each training its choice; the server learns the
        choices (as in the paper's round) and each cluster's sum. First round with ``restarts`` > 1:
        the initialisation whose choices have the lowest mean loss is kept (the plain round
        compares the losses after training instead). Returns (``SecureSums``, the diagnostics)."""
        restarts = self.state.candidates or []
        diagnostics: Diagnostics = {}
        if len(restarts) > 1:
            chosen, diagnostics = yield from self.restart(rnd, trainers, restarts, self.choice_asks)
        else:
            chosen = yield self.choice_asks(rnd, trainers, self.state.models)
        self.state.candidates = []
        groups: dict[int, list[str]] = {}
        for reply in chosen:  # each replying client belongs to the cluster it chose
            self.state.assignment[reply.key] = reply.cluster
            groups.setdefault(reply.cluster, []).append(reply.key)
        sums, more = yield from self.secure_groups(rnd, groups, lambda keys: self.train_asks(rnd, keys))
        diagnostics["ifca_choices"] = {str(c): len(groups.get(c, [])) for c in range(self.state.k)}
        return sums, {**diagnostics, **more}

    def choice_asks(self, rnd: Round, keys: list[str], models: dict[int, dict]) -> list[Ask]:
        """The choice step's asks: the K models offered, the choice asked for, no training."""
        return [Ask(a.key, a.model, {**a.config, "phase": CHOOSE_PHASE}) for a in self.ifca_asks(rnd, keys, models)]

    def aggregate(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        """FedAvg per cluster over the clients that chose it; after kmeans++'s warm-up, the
        K models are seeded from the warm-up models instead."""
        if self.state.warming_up:
            self.state.seeded_round = rnd.number
            return self.seed_from(replies)
        return self.aggregate_clusters(replies)

    def after_train(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        """The round's choices; the models idle for ``reseed-after`` rounds re-seeded
        (``reseed``); round 1's line names what IFCA compares."""
        choices = {c: sum(1 for r in replies if r.cluster == c) for c in range(self.state.k)}
        diagnostics: Diagnostics = {"ifca_choices": {str(c): n for c, n in choices.items()}}
        words = []
        if self.state.warming_up or not replies:
            return diagnostics
        if self.state.seeded_round == rnd.number:  # kmeans++'s warm-up: nobody chose yet
            diagnostics["decision"] = (f"IFCA warm-up: the clients trained θ0; its {self.state.k} models are k-means++ "
                                       f"seeds among their trained models (L2); from the next round "
                                       + compares_words(self.state.k).removeprefix("IFCA "))
            return diagnostics
        if not self.state.last_won and not self.state.idle:
            words.append(compares_words(self.state.k))
        for c, n in choices.items():
            if n:
                self.state.last_won[c], self.state.idle[c] = rnd.number, 0
            else:
                self.state.idle[c] = self.state.idle.get(c, 0) + 1
        names = self.compared_names()
        updates = ({r.key: (r.cluster, flat(r.update, names), r) for r in replies if set(names) <= set(r.arrays)}
                   if self.params.reseed_after else {})
        if self.params.reseed_after:
            idle = [c for c in range(self.state.k) if self.state.idle.get(c, 0) >= self.params.reseed_after]
            if idle:
                said, record = self.reseed(rnd, idle, updates)
                words.append(said)
                diagnostics["ifca_reseed"] = record
        if self.params.reseed_after:
            self.state.previous_cluster = {k: c for k, (c, _, _) in updates.items()}
            self.state.previous_update = {k: x.astype(np.float32) for k, (_, x, _) in updates.items()}
        if words:
            diagnostics["decision"] = "; ".join(words)
        return diagnostics

    def reseed(self, rnd: Round, idle: list[int], updates: dict) -> tuple[str, dict]:
        """Re-seed the first of the ``idle`` models (each won no client for ``reseed-after``
        rounds) from a cluster that holds two groups: the members' updates, cut in two
        (average linkage, cosine), give the same partition in this round and the last
        (``clustering.reproducible``, ARI at least ``DEFAULT_AGREEMENT``, each side at least 2
        clients); the model becomes the mean trained model of the side with the higher mean
        training loss (the worse-fitting clients). No such cluster: the model stays, and the
        words say so. Returns (the round line's words, the record)."""
        model = idle[0]
        idle_for = self.state.idle[model]
        previous = {k: (c, self.state.previous_update[k]) for k, c in self.state.previous_cluster.items()
                    if k in self.state.previous_update}
        best = split_evidence(updates, previous, rnd.number)
        head = f"model {model} won no client for {idle_for} rounds"
        for c in idle:
            self.state.idle[c] = 0  # look again after another reseed-after rounds
        if self.params.dp is not None:
            return f"{head}; not re-seeded: under the dp_* parameters a re-seed would release clients' models " \
                   f"without noise", {"model": model, "reseeded": False}
        if best is None or not best[1].reproduces(DEFAULT_AGREEMENT):
            why = ("no cluster had 4 clients training in it two rounds in a row" if best is None else
                   f"no cluster's updates split in two the same way in two rounds (best: cluster {best[0]}, "
                   f"{best[1].words(DEFAULT_AGREEMENT)})")
            return f"{head}; not re-seeded: {why}", {"model": model, "reseeded": False,
                                                     **({} if best is None else {"cluster": best[0], **best[1].as_record()})}
        cluster, evidence, keys = best
        sides = [[k for k, lab in zip(keys, evidence.labels_a) if lab == side] for side in (0, 1)]
        loss = [float(np.mean([updates[k][2].train_loss or 0.0 for k in side])) for side in sides]
        worse = sides[int(np.argmax(loss))]
        weights = [updates[k][2].weights for k in worse]
        examples = np.array([max(updates[k][2].num_examples, 1) for k in worse], dtype=np.float64)
        self.state.models[model] = {n: (np.tensordot(examples / examples.sum(), np.stack([w[n] for w in weights]), 1)
                                        .astype(weights[0][n].dtype) if np.issubdtype(weights[0][n].dtype, np.floating)
                                        else weights[0][n].copy()) for n in weights[0]}
        record = {"round": rnd.number, "model": model, "cluster": cluster, "clients": sorted(worse, key=natural),
                  "reseeded": True, **evidence.as_record()}
        self.state.reseeds.append(record)
        return (f"{head}; re-seeded from cluster {cluster}'s {len(worse)} worse-fitting clients (mean train loss "
                f"{max(loss):.3g} against {min(loss):.3g}): its members' updates split in two the same way, "
                f"{evidence.words(DEFAULT_AGREEMENT)}"), record

    def restart(self, rnd: Round, trainers: list[str], restarts: list[list[Arrays]], asks: Any = None) -> Steps:
        """Round 1 from each initialisation, each asked by ``asks`` (default ``ifca_asks``: train;
        under secure aggregation ``choice_asks``: choose only); the one of lowest mean training
        loss becomes the cluster models. Returns (its replies, the diagnostics)."""
        asks = asks or self.ifca_asks
        best = None
        for index, models in enumerate(restarts):
            replies = yield asks(rnd, trainers, dict(enumerate(models)))
            loss = mean_train_loss(replies)
            loss = float("inf") if loss is None else loss
            if best is None or loss < best[0]:
                best = (loss, index, replies)
        loss, index, replies = best
        self.state.models = {c: {n: v.copy() for n, v in m.items()} for c, m in enumerate(restarts[index])}
        return replies, {"ifca_restart_kept": index, "ifca_restart_loss": loss}

    def seed_from(self, replies: list[TrainReply]) -> Diagnostics:
        """k-means++ seeds among the warm-up models become the K cluster models; returns the diagnostics."""
        if not replies:
            return {}  # nobody replied: warm up again next round
        replies = sorted(replies, key=lambda r: natural(r.key))
        names = sorted(self.compared_names())  # buffers (BatchNorm counters) would swamp the distances
        X = np.stack([np.concatenate([r.weights[n].ravel() for n in names]).astype(np.float64) for r in replies])
        k = min(self.state.k, len(replies))
        best = None
        for _ in range(self.params.restarts):
            seeds, potential = kmeanspp_seeds(X, k, self.state.rng)
            if best is None or potential < best[1]:
                best = (seeds, potential)
        seeds = best[0]
        models = [replies[i].weights for i in seeds]
        # fewer replies than K: the rest are random initialisations
        models += random_initialisations(self.state.theta0, self.state.k - k + 1, self.state.rng,
                                         self.compared_names())[1:]
        self.state.models = {c: {n: v.copy() for n, v in m.items()} for c, m in enumerate(models)}
        self.state.next_cluster_id = self.state.k
        for reply, position in zip(replies, nearest_seed(X, seeds)):
            self.state.assignment[reply.key] = int(position)  # provisional, until it chooses by loss
        self.state.warming_up = False
        return {"ifca_seed_clients": [replies[i].key for i in seeds], "ifca_potential": best[1]}

    def one_cluster_reason(self, clients: Mapping[str, ClientInfo] | None = None) -> str | None:
        chosen = set(self.state.assignment.values())
        if len(chosen) != 1 or self.state.k == 1:
            return None
        cluster = chosen.pop()
        others = [c for c in range(self.state.k) if c != cluster]
        won = [self.state.last_won[c] for c in others if c in self.state.last_won]
        if not won:  # no other model ever won a client: the paper's words are true
            return f"{self.one_cluster_reasons['one_choice']} (cluster {cluster} of {self.state.k}){self.reseed_words()}"
        return (f"every client's lowest-training-loss model was model {cluster} of {self.state.k} at the end; the "
                f"other models last won a client in round {max(won)}{self.reseed_words()}")

    def reseed_words(self) -> str:
        """What re-seeding did in the run, for the last round line."""
        if not self.params.reseed_after:
            return " (re-seeding off: reseed-after = 0)"
        done = self.state.reseeds
        if not done:
            return (f" (a model idle for {self.params.reseed_after} rounds is re-seeded only from a cluster whose "
                    f"updates split the same way in two successive rounds; none did)")
        return f" ({len(done)} re-seed(s), the last in round {done[-1]['round']})"

    def cluster_count_basis(self) -> str | None:
        """The final clusters: how many of the K models clients chose, the singletons named, the re-seeds."""
        sizes: dict[int, list[str]] = {}
        for key, cluster in self.state.assignment.items():
            sizes.setdefault(cluster, []).append(key)
        if len(sizes) < 2:
            return None
        parts = [f"{len(sizes)} of the {self.state.k} models were each some client's lowest-training-loss model"]
        singles = [f"cluster {c} is a single client ({keys[0]})" for c, keys in sorted(sizes.items()) if len(keys) == 1]
        parts += singles
        unused = [c for c in range(self.state.k) if c not in sizes]
        if unused:
            parts.append(f"model(s) {', '.join(map(str, unused))} won no client at the end{self.reseed_words()}")
        elif self.state.reseeds:
            parts.append(self.reseed_words().strip(" ()"))
        return "; ".join(parts)

    def cluster_state(self) -> dict:
        return {"num_clusters": self.state.k, "init": self.params.init, "reseed_after": self.params.reseed_after,
                "reseeds": list(self.state.reseeds)}
