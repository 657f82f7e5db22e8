"""The round runner: the only server code that speaks Flower.

It owns node discovery and profiling, sending each client its payload, collecting replies
within the round ``timeout``, validation, byte and fault counting, evaluation, recording
and checkpoints. The algorithm (``clusterfed.strategies``) decides what each client is
asked for and folds validated replies into its state; it never sees a message.

Why not Flower's ``Strategy.start`` loop: it threads one ArrayRecord through
configure/aggregate and sends every sampled node the same content. Clustered FL sends
each client its own cluster's model, asks some clients for partial layers, and needs a
profile query before the first send; the loop below does that with Flower's Grid,
Message and records, and is itself a Flower ``Strategy`` so it plugs in where one does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.config import RunConfig
from clusterfed.results import EvalRow, RunRecorder, Traffic
from clusterfed.runner.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from clusterfed.runner.transport import push_and_collect
from clusterfed.runner.validation import ReplyRejected, parse_eval_reply, parse_profile_reply, parse_train_reply
from clusterfed.strategies.base import Algorithm
from clusterfed.strategies.exchange import Arrays, Ask, ClientInfo, Replies, natural

# the held-back newcomers of a simulation are drawn with their own seed, apart from the
# algorithm's sampling
NEWCOMER_SEED_OFFSET = 7919


class ClusteredRunner(Strategy):
    """Drives one ``Algorithm`` over a Flower Grid for ``rounds`` rounds."""

    def __init__(self, config: RunConfig, algorithm: Algorithm, recorder: RunRecorder | None = None,
                 *, deployment: bool = False):
        self.config = config
        # deployment: nodes come and go; a client unreachable in ``absent-after`` consecutive
        # rounds is marked absent (simulation: the federation is fixed, faults are counted only)
        self.deployment = deployment
        self.misses: dict[str, int] = {}
        self.absent: set[str] = set()
        self.answered: set[str] = set()
        self.messaged: set[str] = set()
        self.lags: list[float] = []  # seconds from a reply's creation to its pick-up, this round
        self.algorithm = algorithm
        self.recorder = recorder
        self.flower_config = config.to_flower()
        self.clients: dict[str, ClientInfo] = {}
        self.node_of_key: dict[str, int] = {}
        self.key_of_node: dict[int, str] = {}
        self.held_back: set[str] = set()
        self.shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.traffic = Traffic()
        self.grid: Grid | None = None
        self.completed_rounds = 0
        algorithm.clients = self.clients

    # ------------------------------------------------------------ the loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> Result:
        self.grid = grid
        theta0 = protocol.from_array_record(initial_arrays)
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in theta0.items()}
        first_round = 1
        if self.config.resume_from:
            first_round = self.resume(self.config.resume_from) + 1
        else:
            self.algorithm.init(theta0)
        result = Result()
        for server_round in range(first_round, num_rounds + 1):
            started = time.perf_counter()
            self.traffic = Traffic()
            self.release_newcomers(server_round)
            self.answered, self.messaged, self.lags = set(), set(), []
            self.discover(server_round)
            self.algorithm.active = self.active_keys()
            self.drive(server_round, self.algorithm.round(server_round))
            evals = self.evaluate(server_round)
            self.update_absence(server_round)
            extra = dict(self.algorithm.round_extra)
            if self.deployment and self.lags:
                extra["reply_lag_seconds"] = round(float(np.mean(self.lags)), 3)
            result.train_metrics_clientapp[server_round] = MetricRecord(
                {"replies": self.traffic.transmissions, "train-loss": extra.get("train_loss") or 0.0})
            if self.recorder is not None:
                record = self.record(server_round, evals, time.perf_counter() - started, extra)
                result.evaluate_metrics_clientapp[server_round] = MetricRecord(
                    {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
            self.completed_rounds = server_round
            if self.config.checkpoint and self.recorder is not None:
                save_checkpoint(self.recorder.out, self.checkpoint_state(server_round))
        result.arrays = protocol.to_array_record(
            {f"c{cluster}.{name}": value for cluster, model in self.algorithm.cluster_models().items()
             for name, value in model.items()})
        return result

    def drive(self, server_round: int, steps) -> None:
        """Run one round of the algorithm: each list of asks it yields is sent, and the
        validated replies are sent back into it, until the round is done."""
        try:
            asks = next(steps)
            while True:
                asks = steps.send(self.train(server_round, asks))
        except StopIteration:
            pass

    def record(self, server_round: int, evals: list[EvalRow], seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
        active = self.active_keys()
        groups = {k: self.clients[k].true_group for k in active}
        assignment = {k: self.algorithm.assignment[k] for k in active if k in self.algorithm.assignment}
        return self.recorder.record_round(
            server_round, evals=evals, assignment=assignment, true_groups=groups, traffic=self.traffic,
            round_seconds=seconds, clustering_seconds=self.algorithm.clustering_seconds, extra=extra,
            clients_known=len(active), clients_absent=len(self.absent),
        )

    # ------------------------------------------------------------ membership
    def active_keys(self) -> list[str]:
        return sorted((k for k in self.clients if k not in self.held_back and k not in self.absent), key=natural)

    def update_absence(self, server_round: int) -> None:
        """Deployment: a client messaged this round that never replied with content (an
        error reply or none) misses the round; ``absent-after`` misses in a row mark it
        absent. An absent client keeps its place in the algorithm's assignment and is not
        messaged again until a profile (of a restarted node, or of its node if Flower still
        lists it) brings its key back."""
        if not self.deployment:
            return
        for key in self.messaged:
            if key in self.answered:
                self.misses[key] = 0
                continue
            self.misses[key] = self.misses.get(key, 0) + 1
            if self.misses[key] >= self.config.absent_after and key not in self.absent:
                self.absent.add(key)
                log(logging.WARNING, "round %s: client %s unreachable in %d rounds in a row: marked absent",
                    server_round, key, self.misses[key])

    def discover(self, server_round: int) -> None:
        """Profile nodes seen for the first time: stable key, size, label stats. A node
        whose key is known (a restarted device, a resumed run) takes that client's place,
        unless the key's node is listed and answered in its last round (a duplicate key).
        Deployment: nodes that join after the first round are profiled here and then
        placed by the algorithm's ``admit``; an absent client's node that is still listed
        is asked again."""
        live = list(self.grid.get_node_ids())
        new_nodes = [n for n in live if n not in self.key_of_node]
        # an absent client's node that Flower still lists is asked again: it may be back
        # (a failed re-probe is not counted as a new fault: the client is known to be absent)
        probes = {self.node_of_key[k] for k in self.absent if self.node_of_key.get(k) in live}
        new_nodes += sorted(probes - set(new_nodes))
        if not new_nodes:
            return
        config = protocol.client_spec(self.flower_config)
        config.update({"server-round": server_round,
                       "label-stats": self.algorithm.wants_label_stats and self.config.share_label_stats})
        messages = [Message(RecordDict({protocol.CONFIG: protocol.config_record(config)}), dst_node_id=node,
                            message_type=protocol.PROFILE_QUERY, group_id=str(server_round)) for node in new_nodes]
        message_ids, replies = push_and_collect(self.grid, messages, self.config.timeout, self.lags)
        node_of_message = dict(zip(message_ids, new_nodes))
        first_contact = not self.clients
        reasons = []
        answered = set()
        for reply in replies:
            node = node_of_message[reply.metadata.reply_to_message_id]
            answered.add(node)
            if reply.has_error() and node in probes:
                log(logging.DEBUG, "absent client's node %s still unreachable: %s", node, reply.error.reason)
                continue
            if reply.has_error():
                self.traffic.failures += 1
                self.traffic.fault("error")
                reasons.append(reply.error.reason)
                log(logging.WARNING, "profile of node %s failed: %s", node, reply.error.reason)
                continue
            try:
                info = parse_profile_reply(reply.content)
                owner = self.node_of_key.get(info.key)
                # Flower lists a dead node for a while: a key whose node missed its last
                # round (or is absent) may move to a new node
                owner_gone = info.key in self.absent or self.misses.get(info.key, 0) > 0
                if owner is not None and owner != node and owner in live and not owner_gone:
                    raise ReplyRejected(f"client-key {info.key!r} is already used by live node {owner}", "identity")
            except ReplyRejected as error:
                self.reject(server_round, f"node {node}", error)
                reasons.append(str(error))
                continue
            self.key_of_node.pop(self.node_of_key.get(info.key, -1), None)
            if info.key in self.absent or self.node_of_key.get(info.key) not in (None, node):
                log(logging.INFO, "round %s: client %s is back on node %s", server_round, info.key, node)
            self.absent.discard(info.key)
            self.misses[info.key] = 0
            self.clients[info.key] = info
            self.node_of_key[info.key] = node
            self.key_of_node[node] = info.key
        for node in new_nodes:
            if node not in answered and node not in probes:
                self.traffic.failures += 1
                self.traffic.fault("timeout")
        if first_contact and not self.clients:
            raise RuntimeError(f"no client could load its data; the first error: {reasons[0] if reasons else 'no reply'}")
        if first_contact and self.config.newcomer_fraction > 0:
            keys = sorted(self.clients, key=natural)
            count = int(round(self.config.newcomer_fraction * len(keys)))
            rng = np.random.default_rng(self.config.seed + NEWCOMER_SEED_OFFSET)
            self.held_back = {keys[i] for i in rng.choice(len(keys), size=count, replace=False)}

    def release_newcomers(self, server_round: int) -> None:
        """Simulated newcomers (``newcomer-fraction``) join at ``newcomer-round``."""
        if self.held_back and server_round >= self.config.newcomer_round:
            log(logging.INFO, "round %s: %d newcomers join", server_round, len(self.held_back))
            self.held_back = set()

    # ------------------------------------------------------------ exchange
    def exchange(self, server_round: int, plan: dict[str, tuple[Arrays | None, dict[str, Any]]],
                 message_type: str) -> tuple[dict[str, RecordDict], int]:
        """Send each client its (arrays, config); return the replies that arrived, by key,
        and the array bytes received. Error and missing replies are counted as faults."""
        messages, keys = [], []
        # clients of one cluster are sent the same model object: encode it once per exchange
        # (the transport serialises, or the in-process grid copies, each message on its own)
        records: dict[int, tuple[Arrays, ArrayRecord]] = {}
        configs: dict[str, ConfigRecord] = {}  # and build each distinct config record once
        for key, (arrays, config) in plan.items():
            signature = repr(sorted(config.items()))
            if signature not in configs:
                configs[signature] = protocol.config_record(config)
            content = RecordDict({protocol.CONFIG: configs[signature]})
            if arrays is not None:
                if id(arrays) not in records:
                    records[id(arrays)] = (arrays, protocol.to_array_record(arrays))
                content[protocol.ARRAYS] = records[id(arrays)][1]
            nbytes = protocol.message_array_bytes(content)
            if message_type == MessageType.EVALUATE:
                self.traffic.eval_down += nbytes
            else:
                self.traffic.down += nbytes
            messages.append(Message(content, dst_node_id=self.node_of_key[key], message_type=message_type,
                                    group_id=str(server_round)))
            keys.append(key)
            self.messaged.add(key)
        if not messages:
            return {}, 0
        message_ids, replies = push_and_collect(self.grid, messages, self.config.timeout, self.lags)
        key_of_message = dict(zip(message_ids, keys))
        out: dict[str, RecordDict] = {}
        bytes_up = 0
        for reply in replies:
            key = key_of_message[reply.metadata.reply_to_message_id]
            if reply.has_error():
                self.traffic.failures += 1
                self.traffic.fault("error")
                log(logging.WARNING, "client %s failed: %s", key, reply.error.reason)
                continue
            self.answered.add(key)
            if message_type != MessageType.EVALUATE:
                nbytes = protocol.message_array_bytes(reply.content)
                self.traffic.up += nbytes
                bytes_up += nbytes
                self.traffic.transmissions += 1
            out[key] = reply.content
        for message_id, key in zip(message_ids, keys):
            if not message_id:
                self.traffic.failures += 1
                self.traffic.fault("unavailable")
                log(logging.WARNING, "client %s: its node %s is gone; the message was not delivered",
                    key, self.node_of_key[key])
        missing = len([m for m in message_ids if m]) - len(replies)
        self.traffic.failures += missing
        for _ in range(missing):
            self.traffic.fault("timeout")
        return out, bytes_up

    def base_config(self, server_round: int) -> dict[str, Any]:
        config = protocol.client_spec(self.flower_config)
        config["server-round"] = server_round
        return config

    def train(self, server_round: int, asks: list[Ask]) -> Replies:
        """Send the asks; the validated replies in send order (rejections recorded)."""
        plan = {}
        for ask in asks:
            plan[ask.key] = (ask.model, {**self.base_config(server_round), **ask.config})
        received, bytes_up = self.exchange(server_round, plan, MessageType.TRAIN)
        replies = Replies(bytes_up=bytes_up)
        for ask in asks:
            if ask.key not in received:
                continue
            try:
                replies.append(parse_train_reply(received[ask.key], ask, self.shapes))
            except ReplyRejected as error:
                self.reject(server_round, ask.key, error)
        return replies

    def evaluate(self, server_round: int) -> list[EvalRow]:
        models = self.algorithm.evaluation_models(server_round)
        plan = {key: (model, {**self.base_config(server_round), "phase": "evaluate", "cluster-id": cluster})
                for key, (cluster, model) in models.items()}
        received, _ = self.exchange(server_round, plan, MessageType.EVALUATE)
        rows = []
        for key, content in received.items():
            try:
                accuracy, loss, n = parse_eval_reply(content, key)
            except ReplyRejected as error:
                self.reject(server_round, key, error)
                continue
            rows.append(EvalRow(key, models[key][0], self.clients[key].true_group, accuracy, loss, n))
        return rows

    def reject(self, server_round: int, who: str, error: ReplyRejected) -> None:
        self.traffic.rejected.append({"client": who, "kind": error.kind, "reason": str(error)})
        self.traffic.fault(error.kind)
        log(logging.WARNING, "round %s: rejected reply of client %s: %s", server_round, who, error)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_state(self, server_round: int) -> dict[str, Any]:
        return {
            "round": server_round,
            "config": self.flower_config,
            "model_shapes": {k: (list(s), str(d)) for k, (s, d) in self.shapes.items()},
            "algorithm": self.algorithm.get_state(),
            "clients": self.clients,
            "held_back": sorted(self.held_back),
            "absent": sorted(self.absent),
            "misses": dict(self.misses),
            "recorder": self.recorder.state() if self.recorder is not None else None,
        }

    def resume(self, directory: str | Path) -> int:
        """Restore the state saved after a round; returns that round."""
        state = load_checkpoint(directory)
        check_compatible(state, self.flower_config, {k: (list(s), str(d)) for k, (s, d) in self.shapes.items()})
        self.algorithm.set_state(state["algorithm"])
        self.clients.clear()
        self.clients.update(state["clients"])
        self.held_back = set(state["held_back"])
        self.absent = set(state.get("absent", ()))
        self.misses = dict(state.get("misses", {}))
        if self.recorder is not None and state.get("recorder") is not None:
            self.recorder.restore(state["recorder"])
        log(logging.INFO, "resumed from %s after round %s", directory, state["round"])
        return int(state["round"])

    # ------------------------------------------------- Flower Strategy methods
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        raise NotImplementedError("the runner sends each client its cluster's model in start()")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        raise NotImplementedError("the algorithm aggregates per cluster; see Algorithm.aggregate_clusters")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        raise NotImplementedError("the runner evaluates each client on its cluster's model in start()")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        raise NotImplementedError("see ClusteredRunner.evaluate")

    def summary(self) -> None:
        log(logging.INFO, "%s: %d clusters over %d clients", self.algorithm.name,
            len(set(self.algorithm.assignment.values())), len(self.algorithm.assignment))
