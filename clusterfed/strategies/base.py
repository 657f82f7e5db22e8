"""The clustered algorithm base: K cluster models, assignment by stable client key,
per-cluster training requests and aggregation. As it stands it is FedAvg (K = 1).

An algorithm is transport-free (no Flower, no torch), in the style of FedJAX's
``init``/``apply``: ``init(θ0)`` sets up the state; each round ``round(r)`` is a generator
that yields lists of ``Ask`` (what each client is asked for) and is sent back the
validated ``Replies``; between rounds the whole state is plain data
(``get_state``/``set_state``), which is what checkpoints store. The runner
(``clusterfed.runner``) alone speaks Flower: it discovers and profiles clients, sends the
asks, validates replies, evaluates and records.

A strategy subclass reads like its paper's algorithm box. It overrides ``admit`` (clients
not placed yet), ``before_train`` (clustering steps before this round's training),
``after_train`` (steps that use this round's training replies) and ``train_instructions``.
``admit`` and ``before_train`` may ask clients for work: written as generators, they
``yield`` a list of asks and receive the replies; written as plain methods, they ask
nothing.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Generator, Iterable
from typing import Any

import numpy as np

from clusterfed.strategies.exchange import (
    RETURN_WEIGHTS,
    UPLOAD_FULL,
    Arrays,
    Ask,
    ClientInfo,
    Replies,
    TrainReply,
    natural,
    weighted_average,
)

Steps = Generator[list[Ask], Replies, Any]


def steps(result: Iterable | None) -> Iterable:
    """``yield from steps(hook(...))``: a hook written as a plain method (returns None)
    asks nothing; one written as a generator is run to its end."""
    return () if result is None else result


class Algorithm:
    """FedAvg: one cluster, every client in it. Subclasses add clusters."""

    name = "fedavg"
    # run-config keys of the strategy-specific kind (config.STRATEGY_KEYS) that this
    # strategy reads; setting another one is reported as ignored
    reads: tuple[str, ...] = ()
    wants_label_stats = False
    # state the runner owns and sets each round: not part of the algorithm's state
    RUNNER_FIELDS = ("config", "clients", "active")

    def __init__(self, config):
        self.config = config
        self.clients: dict[str, ClientInfo] = {}
        self.active: list[str] = []
        self.rng = np.random.default_rng(config.seed)
        self.models: dict[int, Arrays] = {}
        self.assignment: dict[str, int] = {}
        self.newcomer_log: list[dict[str, Any]] = []
        self.theta0: Arrays = {}
        self.shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.clustering_seconds = 0.0
        self.round_extra: dict[str, Any] = {}
        self.next_cluster_id = 0

    # ------------------------------------------------------------- lifecycle
    def init(self, theta0: Arrays) -> None:
        self.theta0 = {k: v.copy() for k, v in theta0.items()}
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in theta0.items()}
        self.init_clusters()

    def round(self, server_round: int) -> Steps:
        """One round: place newcomers, clustering steps, train, aggregate per cluster."""
        self.clustering_seconds, self.round_extra = 0.0, {}
        unplaced = [k for k in self.active if k not in self.assignment]
        if unplaced:
            yield from steps(self.admit(server_round, unplaced))
        yield from steps(self.before_train(server_round))
        replies = yield self.train_asks(server_round, self.select_trainers(server_round))
        self.aggregate_clusters(replies)
        self.after_train(server_round, replies)
        self.round_extra["train_loss"] = float(np.mean([r.train_loss for r in replies])) if replies else None

    def get_state(self) -> dict[str, Any]:
        """Everything that decides later rounds, as plain data (a deep copy)."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in self.RUNNER_FIELDS})

    def set_state(self, state: dict[str, Any]) -> None:
        self.__dict__.update(copy.deepcopy(state))

    # ------------------------------------------------------------------ hooks
    def init_clusters(self) -> None:
        """FedAvg: one cluster holding θ0."""
        self.new_cluster(self.theta0)

    def admit(self, server_round: int, keys: list[str]) -> Steps | None:
        """Place clients the server has not assigned yet. FedAvg: the one cluster."""
        for key in keys:
            self.assignment[key] = min(self.models)

    def before_train(self, server_round: int) -> Steps | None:
        """Clustering steps that happen before this round's training."""

    def after_train(self, server_round: int, replies: list[TrainReply]) -> None:
        """Clustering steps that use this round's training replies (CFL splits)."""

    def train_instructions(self, server_round: int, key: str) -> dict[str, Any]:
        """Extra config for one client's train message."""
        return {}

    def cluster_state(self) -> dict[str, Any]:
        """What clusters.json holds beyond assignment and sizes."""
        return {}

    # ---------------------------------------------------------------- helpers
    def new_cluster(self, model: Arrays) -> int:
        cluster = self.next_cluster_id
        self.next_cluster_id += 1
        self.models[cluster] = {k: v.copy() for k, v in model.items()}
        return cluster

    def members(self, cluster: int) -> list[str]:
        active = set(self.active)
        return sorted((k for k, c in self.assignment.items() if c == cluster and k in active), key=natural)

    def placed(self) -> list[str]:
        return [k for k in self.active if k in self.assignment]

    def sample(self, keys: list[str], fraction: float) -> list[str]:
        if fraction >= 1.0 or not keys:
            return list(keys)
        count = max(int(len(keys) * fraction), 1)
        chosen = self.rng.choice(len(keys), size=count, replace=False)
        return [keys[i] for i in sorted(chosen)]

    def select_trainers(self, server_round: int) -> list[str]:
        """The keys that train this round: a ``fraction-train`` sample of placed clients."""
        return self.sample(self.placed(), self.config.fraction_train)

    def train_asks(self, server_round: int, keys: list[str], *, models: dict[str, Arrays] | None = None,
                   extra: dict[str, Any] | None = None, phase: str = "train") -> list[Ask]:
        """Train ``keys``, each on its cluster's model (or on ``models[key]``)."""
        asks = []
        for key in keys:
            cluster = self.assignment.get(key, -1)
            config = {"server-round": server_round, "phase": phase, "local-epochs": self.config.local_epochs,
                      "lr": self.config.lr, "upload": UPLOAD_FULL, "return": RETURN_WEIGHTS, "cluster-id": cluster}
            config.update(self.train_instructions(server_round, key))
            config.update(extra or {})
            asks.append(Ask(key, models[key] if models is not None else self.models[cluster], config))
        return asks

    def aggregate_clusters(self, replies: list[TrainReply]) -> None:
        """Sample-weighted FedAvg inside each cluster over the members that replied; a
        cluster none of whose members replied keeps its model."""
        by_cluster: dict[int, list[TrainReply]] = defaultdict(list)
        for reply in replies:
            if reply.cluster in self.models and set(reply.arrays) == set(self.shapes):
                by_cluster[reply.cluster].append(reply)
        for cluster, group in by_cluster.items():
            self.models[cluster] = weighted_average([r.weights for r in group], [r.num_examples for r in group])

    # ------------------------------------------------------------- evaluation
    def evaluation_models(self, server_round: int) -> dict[str, tuple[int, Arrays]]:
        """Who is evaluated this round, each with (its cluster, the model to test)."""
        if self.config.fraction_evaluate <= 0:
            return {}
        keys = self.sample(self.placed(), self.config.fraction_evaluate)
        return {k: (self.assignment[k], self.eval_model(k)) for k in keys}

    def eval_model(self, key: str) -> Arrays:
        return self.models[self.assignment[key]]

    def final_clusters(self) -> dict[str, Any]:
        assignment = {k: self.assignment[k] for k in sorted(self.assignment, key=natural)}
        sizes: dict[str, int] = defaultdict(int)
        for cluster in assignment.values():
            sizes[str(cluster)] += 1
        state = {
            "strategy": self.name,
            "assignment": assignment,
            "true_groups": {k: self.clients[k].true_group for k in assignment if k in self.clients},
            "sizes": dict(sizes),
            "newcomers": self.newcomer_log,
        }
        state.update(self.cluster_state())
        return state

    def cluster_models(self) -> dict[int, Arrays]:
        """The models clients are served at the end of a run, by cluster id."""
        return self.models
