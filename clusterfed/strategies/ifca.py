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
- ``IFCA.paper()`` (run config ``preset = "paper"``): random initialisations, no restart
  (``PAPER``), the paper's Algorithm 1 as this module runs it.
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
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from clusterfed.clustering.ifca import kmeanspp_seeds, nearest_seed, random_initialisations
from clusterfed.strategies.base import (MULTI_MODEL, ClusteredState, ClusteredStrategy, Steps, StrategyParams,
                                        mean_train_loss)
from clusterfed.protocol import CHOOSE_PHASE
from clusterfed.core.exchange import CHOICES, Arrays, Ask, ClientInfo, Diagnostics, Round, TrainReply, natural, pack_models


class IFCAParams(StrategyParams):
    num_clusters: int = Field(4, alias="num-clusters", ge=1, description="K cluster models")
    init: Literal["random", "kmeans++"] = Field(
        "random", json_schema_extra={"legacy": "ifca-init"}, description="K seeded random models, or k-means++ seeds among the clients' models after a warm-up round")
    restarts: int = Field(1, json_schema_extra={"legacy": "ifca-restarts"}, ge=1, le=20, description="initialisations tried in the first round (random) or seedings (kmeans++)")

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


class IFCA(ClusteredStrategy):
    """IFCA: every sampled client trains the lowest-loss of the K models."""

    name = "ifca"
    Params = IFCAParams
    State = IFCAState
    PAPER = {"init": "random", "restarts": 1}  # the paper's random initialisations, no restart inside a run
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
            best = None
            for index, models in enumerate(restarts):
                chosen = yield self.choice_asks(rnd, trainers, dict(enumerate(models)))
                loss = mean_train_loss(chosen)
                loss = float("inf") if loss is None else loss
                if best is None or loss < best[0]:
                    best = (loss, index, chosen)
            loss, index, chosen = best
            self.state.models = {c: {n: v.copy() for n, v in m.items()} for c, m in enumerate(restarts[index])}
            diagnostics = {"ifca_restart_kept": index, "ifca_restart_loss": loss}
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
        return self.seed_from(replies) if self.state.warming_up else self.aggregate_clusters(replies)

    def after_train(self, rnd: Round, replies: list[TrainReply]) -> Diagnostics:
        return {"ifca_choices": {str(c): sum(1 for r in replies if r.cluster == c) for c in range(self.state.k)}}

    def restart(self, rnd: Round, trainers: list[str], restarts: list[list[Arrays]]) -> Steps:
        """Round 1 from each initialisation; the one of lowest mean training loss becomes the
        cluster models. Returns (its replies, the diagnostics)."""
        best = None
        for index, models in enumerate(restarts):
            replies = yield self.ifca_asks(rnd, trainers, dict(enumerate(models)))
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
        return f"{self.one_cluster_reasons['one_choice']} (cluster {chosen.pop()} of {self.state.k})"

    def cluster_state(self) -> dict:
        return {"num_clusters": self.state.k, "init": self.params.init}
