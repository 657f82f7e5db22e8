"""The clustered-strategy base: K cluster models, assignment by stable client key,
per-cluster dispatch and aggregation, partial-upload requests, reply validation, metrics.

A strategy subclass reads like its paper's algorithm box: it overrides ``admit`` (what
happens to clients the server has not placed yet), ``before_train`` / ``after_train``
(clustering steps) and ``train_instructions`` (what to ask clients for). FedAvg is the
K = 1 case of this class.

Why not ``Strategy.start`` from Flower: its loop threads one ArrayRecord through
configure/aggregate and sends every sampled node the same content. Clustered FL sends
each client its own cluster's model, asks some clients for partial layers, and needs a
profile query before the first send; the round loop below does that with Flower's
Grid, Message and records, and keeps the Strategy methods meaningful for callers.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.config import RunConfig
from clusterfed.results import EvalRow, RunRecorder, Traffic

Arrays = dict[str, np.ndarray]


@dataclass
class ClientInfo:
    key: str
    node_id: int
    true_group: int  # metrics only: no algorithm may read it (the oracle excepted)
    num_examples: int
    label_stats: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainReply:
    key: str
    cluster: int
    arrays: Arrays  # what the client returned (weights or updates), validated
    sent: Arrays  # the model it was sent (same names as ``arrays``)
    num_examples: int
    train_loss: float
    metrics: dict[str, float]

    @property
    def update(self) -> Arrays:
        return self.arrays if self.is_update else {k: self.arrays[k] - self.sent[k] for k in self.arrays}

    @property
    def weights(self) -> Arrays:
        return {k: self.sent[k] + self.arrays[k] for k in self.arrays} if self.is_update else self.arrays

    is_update: bool = False


class ReplyRejected(ValueError):
    pass


def validate_arrays(arrays: Arrays, expected: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """Names, shapes, dtypes and finite values, or ReplyRejected saying what is wrong."""
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise ReplyRejected(f"array names differ: missing {missing}, unexpected {extra}")
    for name, (shape, dtype) in expected.items():
        value = arrays[name]
        if tuple(value.shape) != tuple(shape):
            raise ReplyRejected(f"{name}: shape {tuple(value.shape)} != expected {tuple(shape)}")
        if value.dtype != dtype:
            raise ReplyRejected(f"{name}: dtype {value.dtype} != expected {dtype}")
        if not np.all(np.isfinite(value)):
            raise ReplyRejected(f"{name}: contains NaN or infinite values")


def weighted_average(arrays: list[Arrays], weights: list[float]) -> Arrays:
    total = float(sum(weights))
    names = arrays[0].keys()
    return {
        n: (sum(w * a[n].astype(np.float64) for a, w in zip(arrays, weights)) / total).astype(arrays[0][n].dtype)
        for n in names
    }


class ClusteredStrategy(Strategy):
    """Base class; as it stands it is FedAvg (one cluster, every client in it)."""

    name = "fedavg"
    wants_label_stats = False

    def __init__(self, config: RunConfig, recorder: RunRecorder | None = None):
        self.config = config
        self.recorder = recorder
        self.rng = np.random.default_rng(config.seed)
        self.models: dict[int, Arrays] = {}
        self.assignment: dict[str, int] = {}
        self.clients: dict[str, ClientInfo] = {}
        self.key_of_node: dict[int, str] = {}
        self.held_back: set[str] = set()
        self.newcomer_log: list[dict[str, Any]] = []
        self.theta0: Arrays = {}
        self.shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.traffic = Traffic()
        self.clustering_seconds = 0.0
        self.round_extra: dict[str, Any] = {}
        self.next_cluster_id = 0
        self.grid: Grid | None = None
        self.flower_config = config.to_flower()

    # ------------------------------------------------------------------ hooks
    def init_clusters(self) -> None:
        """FedAvg: one cluster holding θ0."""
        self.new_cluster(self.theta0)

    def admit(self, server_round: int, keys: list[str]) -> None:
        """Place clients the server has not assigned yet. FedAvg: the one cluster."""
        for key in keys:
            self.assignment[key] = min(self.models)

    def before_train(self, server_round: int) -> None:
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

    def active_keys(self) -> list[str]:
        return sorted((k for k in self.clients if k not in self.held_back), key=_natural)

    def members(self, cluster: int) -> list[str]:
        return sorted((k for k, c in self.assignment.items() if c == cluster and k not in self.held_back), key=_natural)

    def sample(self, keys: list[str], fraction: float) -> list[str]:
        if fraction >= 1.0 or not keys:
            return list(keys)
        count = max(int(len(keys) * fraction), 1)
        chosen = self.rng.choice(len(keys), size=count, replace=False)
        return [keys[i] for i in sorted(chosen)]

    def base_config(self, server_round: int, phase: str) -> dict[str, Any]:
        values = protocol.client_spec(self.flower_config)
        values.update(
            {
                "server-round": server_round,
                "phase": phase,
                "local-epochs": self.config.local_epochs,
                "lr": self.config.lr,
                "upload": protocol.UPLOAD_FULL,
                "return": protocol.RETURN_WEIGHTS,
            }
        )
        return values

    # ------------------------------------------------------- message exchange
    def exchange(
        self, server_round: int, plan: dict[str, tuple[Arrays | None, dict[str, Any]]], message_type: str
    ) -> dict[str, RecordDict]:
        """Send each client its (arrays, config), return the replies that arrived, by key.
        Counts the array bytes both ways; error replies and missing replies are failures."""
        assert self.grid is not None
        messages, key_of_message = [], {}
        for key, (arrays, config) in plan.items():
            content = RecordDict({protocol.CONFIG: protocol.config_record(config)})
            if arrays is not None:
                content[protocol.ARRAYS] = protocol.to_array_record(arrays)
            message = Message(content, dst_node_id=self.clients[key].node_id, message_type=message_type,
                              group_id=str(server_round))
            nbytes = protocol.message_array_bytes(content)
            if message_type == MessageType.EVALUATE:
                self.traffic.eval_down += nbytes
            else:
                self.traffic.down += nbytes
            messages.append((key, message))
        if not messages:
            return {}
        message_ids = list(self.grid.push_messages([m for _, m in messages]))
        for (key, _), message_id in zip(messages, message_ids):
            key_of_message[message_id] = key
        replies = _collect(self.grid, message_ids, self.config.timeout)
        out: dict[str, RecordDict] = {}
        for reply in replies:
            key = key_of_message.get(reply.metadata.reply_to_message_id)
            if key is None:
                continue
            if reply.has_error():
                self.traffic.failures += 1
                log(logging.WARNING, "client %s failed: %s", key, reply.error.reason)
                continue
            if message_type != MessageType.EVALUATE:
                self.traffic.up += protocol.message_array_bytes(reply.content)
                self.traffic.transmissions += 1
            out[key] = reply.content
        self.traffic.failures += len(plan) - len(out) - sum(1 for r in replies if r.has_error())
        return out

    def reject(self, server_round: int, key: str, reason: str) -> None:
        self.traffic.rejected.append({"client": key, "reason": reason})
        log(logging.WARNING, "round %s: rejected reply of client %s: %s", server_round, key, reason)

    def train_clients(
        self, server_round: int, keys: list[str], *, models: dict[str, Arrays] | None = None,
        extra: dict[str, Any] | None = None, phase: str = "train",
    ) -> list[TrainReply]:
        """Train ``keys`` (each on its cluster's model, or on ``models[key]``) and return
        their validated replies."""
        plan, sent_models = {}, {}
        for key in keys:
            config = self.base_config(server_round, phase)
            cluster = self.assignment.get(key, -1)
            config["cluster-id"] = cluster
            config.update(self.train_instructions(server_round, key))
            config.update(extra or {})
            model = models[key] if models is not None else self.models[cluster]
            plan[key], sent_models[key] = (model, config), model
        replies = self.exchange(server_round, plan, MessageType.TRAIN)
        out = []
        for key, content in replies.items():
            config = plan[key][1]
            try:
                out.append(self._parse_train_reply(key, content, config, sent_models[key]))
            except ReplyRejected as error:
                self.reject(server_round, key, str(error))
        return out

    def _parse_train_reply(self, key: str, content: RecordDict, config: dict, sent: Arrays) -> TrainReply:
        if protocol.ARRAYS not in content or protocol.METRICS not in content:
            raise ReplyRejected("reply lacks arrays or metrics")
        names = protocol.parse_upload(str(config["upload"])) or list(self.shapes)
        expected = {n: self.shapes[n] for n in names if n in self.shapes}
        if len(expected) != len(names):
            raise ReplyRejected(f"server asked for unknown arrays {names}")
        try:
            arrays = protocol.from_array_record(content[protocol.ARRAYS])
        except Exception as error:  # a corrupt Array cannot be decoded
            raise ReplyRejected(f"arrays could not be decoded: {error}") from None
        validate_arrays(arrays, expected)
        metrics = dict(content[protocol.METRICS])
        n = metrics.get("num-examples")
        if not isinstance(n, int) or n <= 0:
            raise ReplyRejected(f"num-examples must be a positive integer, got {n!r}")
        client = content.get(protocol.CLIENT)
        if client is not None and str(client.get("client-key")) != key:
            raise ReplyRejected(f"reply names client-key {client.get('client-key')!r}, expected {key!r}")
        return TrainReply(
            key=key,
            cluster=int(config["cluster-id"]),
            arrays=arrays,
            sent={n: sent[n] for n in arrays},
            num_examples=n,
            train_loss=float(metrics.get("train-loss", float("nan"))),
            metrics={k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
            is_update=config["return"] == protocol.RETURN_UPDATE,
        )

    def aggregate_clusters(self, replies: list[TrainReply]) -> None:
        """Sample-weighted FedAvg inside each cluster over the members that replied."""
        by_cluster: dict[int, list[TrainReply]] = defaultdict(list)
        for reply in replies:
            if reply.cluster in self.models and set(reply.arrays) == set(self.shapes):
                by_cluster[reply.cluster].append(reply)
        for cluster, group in by_cluster.items():
            self.models[cluster] = weighted_average([r.weights for r in group], [r.num_examples for r in group])

    # ----------------------------------------------------------- discovery
    def discover(self, server_round: int) -> None:
        """Profile nodes seen for the first time: stable key, size, label stats."""
        assert self.grid is not None
        new_nodes = [n for n in self.grid.get_node_ids() if n not in self.key_of_node]
        if not new_nodes:
            return
        config = protocol.client_spec(self.flower_config)
        config.update({"server-round": server_round, "label-stats": self.wants_label_stats and self.config.share_label_stats})
        messages = [
            Message(RecordDict({protocol.CONFIG: protocol.config_record(config)}), dst_node_id=node,
                    message_type=protocol.PROFILE_QUERY, group_id=str(server_round))
            for node in new_nodes
        ]
        message_ids = list(self.grid.push_messages(messages))
        node_of_message = dict(zip(message_ids, new_nodes))
        first_contact = not self.clients
        reasons = []
        for reply in _collect(self.grid, message_ids, self.config.timeout):
            node = node_of_message.get(reply.metadata.reply_to_message_id)
            if reply.has_error() or node is None:
                self.traffic.failures += 1
                if reply.has_error():
                    reasons.append(reply.error.reason)
                    log(logging.WARNING, "profile of node %s failed: %s", node, reply.error.reason)
                continue
            client, metrics = reply.content[protocol.CLIENT], reply.content[protocol.METRICS]
            key = str(client["client-key"])
            stats = {k: float(metrics[k]) for k in ("num-classes", "label-entropy") if k in metrics}
            self.clients[key] = ClientInfo(key, node, int(client["true-group"]), int(metrics["num-examples"]), stats)
            self.key_of_node[node] = key
        if first_contact and not self.clients:
            raise RuntimeError(f"no client could load its data; the first error: {reasons[0] if reasons else 'no reply'}")
        if first_contact and self.config.newcomer_fraction > 0:
            keys = sorted(self.clients, key=_natural)
            count = int(round(self.config.newcomer_fraction * len(keys)))
            chosen = np.random.default_rng(self.config.seed + 7919).choice(len(keys), size=count, replace=False)
            self.held_back = {keys[i] for i in chosen}

    def release_newcomers(self, server_round: int) -> None:
        if self.held_back and server_round >= self.config.newcomer_round:
            log(logging.INFO, "round %s: %d newcomers join", server_round, len(self.held_back))
            self.held_back = set()

    # -------------------------------------------------------------- the loop
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Any = None,
    ) -> Result:
        self.grid = grid
        self.theta0 = protocol.from_array_record(initial_arrays)
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in self.theta0.items()}
        self.init_clusters()
        result = Result()
        for server_round in range(1, num_rounds + 1):
            started = time.perf_counter()
            self.traffic, self.clustering_seconds, self.round_extra = Traffic(), 0.0, {}
            self.release_newcomers(server_round)
            self.discover(server_round)
            unplaced = [k for k in self.active_keys() if k not in self.assignment]
            if unplaced:
                self.admit(server_round, unplaced)
            self.before_train(server_round)
            replies = self.train_clients(server_round, self.select_trainers(server_round))
            self.aggregate_clusters(replies)
            self.after_train(server_round, replies)
            result.train_metrics_clientapp[server_round] = MetricRecord(
                {"replies": len(replies), "train-loss": float(np.mean([r.train_loss for r in replies])) if replies else 0.0}
            )
            evals = self.evaluate_clients(server_round)
            if self.recorder is not None:
                groups = {k: self.clients[k].true_group for k in self.active_keys()}
                assignment = {k: self.assignment[k] for k in self.active_keys() if k in self.assignment}
                record = self.recorder.record_round(
                    server_round, evals=evals, assignment=assignment, true_groups=groups, traffic=self.traffic,
                    round_seconds=time.perf_counter() - started, clustering_seconds=self.clustering_seconds,
                    extra=self.round_extra,
                )
                result.evaluate_metrics_clientapp[server_round] = MetricRecord(
                    {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                )
        result.arrays = protocol.to_array_record(
            {f"c{cluster}.{name}": value for cluster, model in self.models.items() for name, value in model.items()}
        )
        return result

    def evaluate_clients(self, server_round: int) -> list[EvalRow]:
        if self.config.fraction_evaluate <= 0:
            return []
        keys = [k for k in self.active_keys() if k in self.assignment]
        keys = self.sample(keys, self.config.fraction_evaluate)
        plan = {k: (self.eval_model(k), self.base_config(server_round, "evaluate")) for k in keys}
        rows = []
        for key, content in self.exchange(server_round, plan, MessageType.EVALUATE).items():
            metrics = content.get(protocol.METRICS)
            try:
                accuracy, loss, n = float(metrics["eval-accuracy"]), float(metrics["eval-loss"]), int(metrics["num-examples"])
            except (KeyError, TypeError, ValueError):
                self.reject(server_round, key, "evaluate reply lacks eval-accuracy / eval-loss / num-examples")
                continue
            if not (0.0 <= accuracy <= 1.0 and np.isfinite(loss)):
                self.reject(server_round, key, f"evaluate reply out of range: accuracy {accuracy}, loss {loss}")
                continue
            rows.append(EvalRow(key, self.assignment[key], self.clients[key].true_group, accuracy, loss, n))
        return rows

    def eval_model(self, key: str) -> Arrays:
        return self.models[self.assignment[key]]

    def final_clusters(self) -> dict[str, Any]:
        assignment = {k: self.assignment[k] for k in sorted(self.assignment, key=_natural)}
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

    # ------------------------------------------------- Flower Strategy methods
    def select_trainers(self, server_round: int) -> list[str]:
        """The keys that train this round: a ``fraction-train`` sample of placed clients."""
        keys = [k for k in self.active_keys() if k in self.assignment]
        return self.sample(keys, self.config.fraction_train)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        raise NotImplementedError("clustered strategies send each client its cluster's model in start(); see train_clients")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        raise NotImplementedError("clustered strategies aggregate per cluster in start(); see aggregate_clusters")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        raise NotImplementedError("clustered strategies evaluate each client on its cluster's model in start()")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        raise NotImplementedError("see evaluate_clients")

    def summary(self) -> None:
        log(logging.INFO, "%s: %d clusters over %d clients", self.name, len(set(self.assignment.values())), len(self.assignment))


def _collect(grid: Grid, message_ids: list[str], timeout: float) -> list[Message]:
    """Pull replies until all arrived or ``timeout`` seconds passed (late replies are dropped)."""
    pending, replies = set(message_ids), []
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages([m for m in message_ids if m in pending]):
            replies.append(reply)
            pending.discard(reply.metadata.reply_to_message_id)
        if pending:
            time.sleep(0.02)
    # in the order the messages were sent, so aggregation sums in the same order every run
    position = {message_id: i for i, message_id in enumerate(message_ids)}
    return sorted(replies, key=lambda r: position.get(r.metadata.reply_to_message_id, len(position)))


def _natural(key: str) -> tuple[int, str]:
    """Sort client keys 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    return (int(key), "") if key.isdigit() else (1 << 62, key)
