"""The round driver: the only server code that speaks Flower on a strategy's behalf.

``ClusteredStrategy.start`` hands itself to a ``RoundDriver``, which owns node discovery
and profiling, sending each client its payload, collecting replies within the round
``timeout``, validation, byte and fault counting, evaluation, recording and checkpoints.
The strategy decides what each client is asked for and folds validated replies into its
state; it never sees a message.

Why not Flower's ``Strategy.start`` loop: it threads one ArrayRecord through
configure/aggregate and sends every sampled node the same content. Clustered FL sends
each client its own cluster's model, asks some clients for partial layers, and needs a
profile query before the first send; the loop below does that with Flower's Grid,
Message and records.

Stock Flower ClientApps (no profile query, full weights back, Flower's metric names) are
served too: a node that answers the profile query with "no query function registered" is
keyed by its node id (``node-<id>``), its replies are taken as full weights, and the
arrays the strategy asked for are sliced from them here.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.results import EvalRow, RunRecorder, Traffic
from clusterfed.runner.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from clusterfed.runner.transport import push_and_collect
from clusterfed.runner.validation import ReplyRejected, parse_eval_reply, parse_profile_reply, parse_train_reply
from clusterfed.strategies.base import CAPABILITIES, LABEL_STATS, ClusteredResult, StrategyParamsError, mean_train_loss
from clusterfed.strategies.exchange import Arrays, Ask, ClientInfo, Replies, TrainReply, natural

if TYPE_CHECKING:
    from clusterfed.strategies.base import ClusteredStrategy

# the held-back newcomers of a simulation are drawn with their own seed, apart from the
# algorithm's sampling
NEWCOMER_SEED_OFFSET = 7919
# Flower's ClientApp answers a message type it has no function for with this error
NO_PROFILE_HANDLER = "No query function registered"
STOCK_KEY_PREFIX = "node-"
# how clusterfed's ClientApp names itself in an error reply (clusterfed.client.app.ClientFailure)
KEY_IN_REASON = re.compile(r'\[client-key ("(?:[^"\\]|\\.)*")\]\s*')
# Flower's SuperNode wraps a ClientApp's exception as "<class 'X'>:<'message'>"
FLOWER_REASON = re.compile(r"^<class '([^']*)'>:<'(.*)'>$", re.DOTALL)
REASON_CHARS = 300


def key_in_reason(reason: str) -> str | None:
    """The client key a clusterfed ClientApp put into its error reply, if any."""
    match = KEY_IN_REASON.search(reason or "")
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1)))
    except ValueError:
        return None


def first_line(reason: str) -> str:
    """An error reply's reason as one line: ``Type: message`` (Flower's ``<class ...>:<'...'>``
    wrapper and the client-key tag taken off), the first non-empty line, at most ``REASON_CHARS`` characters."""
    text = str(reason or "")
    match = FLOWER_REASON.match(text.strip())
    if match is not None:
        text = f"{match.group(1).rpartition('.')[2]}: {match.group(2)}"
    text = KEY_IN_REASON.sub("", text, count=1)
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 1] + "…"


@dataclass
class RunOptions:
    """What an application adds around a strategy (the built-in app sets all of them; a
    user's own ServerApp needs none): recording, checkpoints, membership, simulated
    newcomers."""

    recorder: RunRecorder | None = None
    deployment: bool | None = None  # None: a grid that is not a simulation's is a deployment
    checkpoint: bool = False  # write the full state after every round into the recorder's folder
    resume_from: str = ""
    absent_after: int = 2
    newcomer_fraction: float = 0.0
    newcomer_round: int = 10
    seed: int = 0
    # the flat run config a checkpoint is checked against on resume
    run_config: dict[str, Any] = field(default_factory=dict)


def is_simulation(grid: Grid) -> bool:
    """Flower's in-memory grid (``flwr run`` on a simulation federation, ``run_simulation``)
    or our in-process grid: a fixed federation."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return isinstance(grid, InMemoryGrid) or getattr(grid, "nothing_in_flight", None) is not None


class RoundDriver:
    """Drives one ``ClusteredStrategy`` over a Flower Grid for ``num_rounds`` rounds."""

    def __init__(self, strategy: ClusteredStrategy, options: RunOptions | None = None):
        self.options = options or RunOptions(seed=strategy.params.seed)
        self.strategy = self.algorithm = strategy
        self.recorder = self.options.recorder
        self.deployment = bool(self.options.deployment)
        self.misses: dict[str, int] = {}
        self.absent: set[str] = set()
        self.answered: set[str] = set()
        self.messaged: set[str] = set()
        self.lags: list[float] = []  # seconds from a reply's creation to its pick-up, this round
        self.clients: dict[str, ClientInfo] = strategy.clients
        self.stock: set[str] = set()  # keys of stock Flower ClientApps (no profile query)
        self.node_of_key: dict[str, int] = {}
        self.key_of_node: dict[int, str] = {}
        self.failed_keys: set[str] = set()  # clients whose reply this round was an error or rejected
        # nodes whose profile failed (never admitted): misses in a row, and those marked absent
        # (node id -> the key their error reply named, or None)
        self.node_misses: dict[int, int] = {}
        self.benched: dict[int, str | None] = {}
        # client keys claimed by more than one live node: key -> {node: its profile}; neither
        # claimant is trained or evaluated until only one is listed
        self.duplicates: dict[str, dict[int, ClientInfo | None]] = {}
        self.held_back: set[str] = set()
        self.shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.traffic = Traffic()
        self.grid: Grid | None = None
        self.timeout = 3600.0
        self.train_config: dict[str, Any] = {}
        self.evaluate_config: dict[str, Any] = {}
        self.round_train_metrics: list[tuple[int, dict[str, float]]] = []
        self.round_eval_metrics: list[tuple[int, dict[str, float]]] = []
        self.completed_rounds = 0
        self.evaluate_sent = 0  # clients sent an evaluate message this round
        self.pending_asks: dict[str, Ask] = {}
        self.accepted_train = 0  # train replies accepted over the run
        self.first_failure: str | None = None

    # ------------------------------------------------------------ the loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> ClusteredResult:
        self.grid, self.timeout = grid, float(timeout)
        if self.options.deployment is None:
            self.deployment = not is_simulation(grid)
        self.train_config = dict(train_config or {})
        self.evaluate_config = dict(evaluate_config or {})
        self.strategy.check_train_config(self.train_config)
        self.strategy.train_config = self.train_config
        theta0 = protocol.from_array_record(initial_arrays)
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in theta0.items()}
        self.wait_for_nodes()
        first_round = 1
        if self.options.resume_from:
            first_round = self.resume(self.options.resume_from) + 1
        else:
            self.strategy.init(theta0)
        result = ClusteredResult()
        for server_round in range(first_round, num_rounds + 1):
            started = time.perf_counter()
            self.traffic = Traffic()
            self.round_train_metrics, self.round_eval_metrics = [], []
            self.release_newcomers(server_round)
            self.answered, self.messaged, self.lags, self.failed_keys = set(), set(), [], set()
            self.discover(server_round)
            if server_round == first_round:
                self.check_capabilities()
            self.strategy.active = self.active_keys()
            self.drive(server_round, self.strategy.round(server_round))
            evals = self.evaluate(server_round)
            self.update_absence(server_round)
            result.traffic["bytes_down"] += self.traffic.down
            result.traffic["bytes_up"] += self.traffic.up
            result.traffic["eval_bytes_down"] += self.traffic.eval_down
            extra = dict(self.strategy.round_extra)
            if self.deployment and self.lags:
                extra["reply_lag_seconds"] = round(float(np.mean(self.lags)), 3)
            if self.absent or self.benched:
                extra["absent"] = sorted(self.absent, key=natural) + [
                    {"client": key, "node": node} for node, key in sorted(self.benched.items())]
            if self.duplicates:
                extra["duplicate_keys"] = [{"client": key, "nodes": sorted(claim)}
                                           for key, claim in sorted(self.duplicates.items())]
            result.train_metrics_clientapp[server_round] = weighted_metrics(self.round_train_metrics)
            result.evaluate_metrics_clientapp[server_round] = weighted_metrics(self.round_eval_metrics)
            if evaluate_fn is not None:
                server_metrics = evaluate_fn(server_round, self.largest_cluster_record())
                if server_metrics is not None:
                    result.evaluate_metrics_serverapp[server_round] = server_metrics
            if self.recorder is not None:
                self.record(server_round, evals, time.perf_counter() - started, extra)
            self.completed_rounds = server_round
            if not self.accepted_train:  # a run in which nothing trained is not a clustering result
                self.strategy.training_failed = (
                    f"no client's train reply was accepted in {server_round - first_round + 1} round(s); "
                    f"the first failure: {self.first_failure or 'no reply'}")
                log(logging.ERROR, "round %s: %s", server_round, self.strategy.training_failed)
            else:
                self.strategy.training_failed = None
            if self.options.checkpoint and self.recorder is not None:
                save_checkpoint(self.recorder.out, self.checkpoint_state(server_round))
        models = self.strategy.cluster_models()
        result.cluster_arrays = {c: protocol.to_array_record(m) for c, m in sorted(models.items())}
        result.arrays = self.largest_cluster_record()
        result.assignment = dict(self.strategy.assignment)
        result.clustering = self.strategy.final_clusters()
        return result

    def largest_cluster_record(self) -> ArrayRecord:
        """The model of the cluster with the most clients (ties: the lowest id)."""
        models = self.strategy.cluster_models()
        if not models:
            return ArrayRecord()
        sizes = {c: 0 for c in models}
        for cluster in self.strategy.assignment.values():
            if cluster in sizes:
                sizes[cluster] += 1
        return protocol.to_array_record(models[max(sorted(sizes), key=lambda c: sizes[c])])

    def wait_for_nodes(self) -> None:
        """Wait up to the timeout until ``min-available-nodes`` nodes are connected."""
        needed = self.strategy.params.min_available_nodes
        if not needed:
            return
        deadline = time.monotonic() + self.timeout
        while (online := len(list(self.grid.get_node_ids()))) < needed:
            if time.monotonic() >= deadline:
                raise StrategyParamsError(f"only {online} of min-available-nodes = {needed} nodes connected "
                                          f"within {self.timeout:g} s")
            time.sleep(1.0)

    def check_capabilities(self) -> None:
        """Before round 1: a strategy that needs more than a stock ClientApp gives stops with
        one message naming the capability and the stock clients."""
        needed = self.strategy.requires()
        if needed and self.stock:
            what = "; ".join(CAPABILITIES[c] for c in sorted(needed))
            nodes = ", ".join(sorted(self.stock, key=natural)[:5]) + (" …" if len(self.stock) > 5 else "")
            raise StrategyParamsError(
                f"strategy {self.strategy.name!r} needs clients capable of {what}, but {len(self.stock)} client(s) "
                f"answer as a stock Flower ClientApp (no profile query): {nodes}. Build the ClientApp with "
                f"clusterfed.client (see the README, 'Use clusterfed in your own Flower app').")

    def drive(self, server_round: int, steps) -> None:
        """Run one round of the strategy: each list of asks it yields is sent, and the
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
        assignment = {k: self.strategy.assignment[k] for k in active if k in self.strategy.assignment}
        return self.recorder.record_round(
            server_round, evals=evals, assignment=assignment, true_groups=groups, traffic=self.traffic,
            round_seconds=seconds, clustering_seconds=self.strategy.clustering_seconds, extra=extra,
            clients_known=len(active), clients_absent=len(self.absent) + len(self.benched),
            clients_to_evaluate=self.evaluate_sent,
        )

    # ------------------------------------------------------------ membership
    def active_keys(self) -> list[str]:
        return sorted((k for k in self.clients
                       if k not in self.held_back and k not in self.absent and k not in self.duplicates), key=natural)

    def update_absence(self, server_round: int) -> None:
        """Deployment: a client messaged this round that never replied with usable content
        (an error reply, a rejected reply or none) misses the round; ``absent-after`` misses
        in a row mark it
        absent. An absent client keeps its place in the algorithm's assignment and is not
        messaged again until a profile (of a restarted node, or of its node if Flower still
        lists it) brings its key back."""
        if not self.deployment:
            return
        for key in self.messaged:
            if key in self.answered and key not in self.failed_keys:
                self.misses[key] = 0
                continue
            self.misses[key] = self.misses.get(key, 0) + 1
            if self.misses[key] >= self.options.absent_after and key not in self.absent:
                self.absent.add(key)
                log(logging.WARNING, "round %s: client %s (node %s) failed or was unreachable in %d rounds in a "
                    "row: marked absent, not messaged until it answers a profile query again",
                    server_round, key, self.node_of_key.get(key), self.misses[key])

    def fail(self, kind: str, reason: str, key: str | None, node: int | None) -> None:
        """One failure (an error reply, no reply, an undeliverable message), named."""
        self.traffic.failures += 1
        self.traffic.fault(kind)
        self.traffic.failed.append({"client": key, "node": node, "kind": kind, "reason": first_line(reason)})
        self.first_failure = self.first_failure or f"client {key} (node {node}): {first_line(reason)}"
        if key is not None:
            self.failed_keys.add(key)

    def profile_failed(self, server_round: int, node: int, key: str | None) -> None:
        """A node whose profile failed is never admitted; ``absent-after`` failures in a row
        mark it absent: it is then only asked for its profile again, and a failure of that is
        not a new fault."""
        self.node_misses[node] = self.node_misses.get(node, 0) + 1
        if self.node_misses[node] >= self.options.absent_after and node not in self.benched:
            self.benched[node] = key
            log(logging.WARNING, "round %s: client %s (node %s) failed its profile query in %d rounds in a row: "
                "marked absent", server_round, key if key is not None else "(no key)", node, self.node_misses[node])

    def resolve_duplicates(self, server_round: int, live: list[int]) -> None:
        """A key claimed by several nodes goes to the one left listed, when only one is."""
        for key, claim in list(self.duplicates.items()):
            for node in [n for n in claim if n not in live]:
                del claim[node]
            if len(claim) > 1:
                continue
            del self.duplicates[key]
            if not claim:
                self.absent.add(key)
                continue
            node, info = next(iter(claim.items()))
            log(logging.WARNING, "round %s: client-key %r is now claimed by node %s alone: it takes part again",
                server_round, key, node)
            self.admit_node(server_round, node, info if info is not None else self.clients[key])

    def contest(self, server_round: int, key: str, owner: int, node: int, info: ClientInfo) -> None:
        claim = self.duplicates.setdefault(key, {owner: self.clients.get(key)})
        claim[node] = info
        log(logging.WARNING, "round %s: client-key %r is claimed by nodes %s: neither is trained nor evaluated "
            "until only one of them is connected; give each SuperNode its own client-key",
            server_round, key, ", ".join(map(str, sorted(claim))))

    def profile_config(self, server_round: int) -> dict[str, Any]:
        config = dict(self.train_config)
        config.update({"server-round": server_round, "label-stats": LABEL_STATS in self.strategy.requires()})
        return config

    def discover(self, server_round: int) -> None:
        """Profile nodes seen for the first time: stable key, size, label stats. A node
        whose key is known (a restarted device, a resumed run) takes that client's place,
        unless the key's node is listed and answered in its last round (a duplicate key).
        A node that answers with "no query function registered" is a stock Flower
        ClientApp: keyed by its node id. Deployment: nodes that join after the first round
        are profiled here and then placed by the algorithm's ``admit``; an absent client's
        node that is still listed is asked again."""
        live = list(self.grid.get_node_ids())
        self.resolve_duplicates(server_round, live)
        for node in [n for n, key in self.benched.items() if key is None and n not in live]:
            del self.benched[node]  # a device that never said its key and whose node is gone: forgotten
        claimants = {n for claim in self.duplicates.values() for n in claim}
        new_nodes = [n for n in live if n not in self.key_of_node and n not in claimants and n not in self.benched]
        # an absent client's node that Flower still lists is asked again: it may be back
        # (a failed re-probe is not counted as a new fault: the client is known to be absent)
        probes = {self.node_of_key[k] for k in self.absent if self.node_of_key.get(k) in live}
        probes |= {n for n in self.benched if n in live}
        new_nodes += sorted(probes - set(new_nodes))
        if not new_nodes:
            return
        config = self.profile_config(server_round)
        messages = [Message(RecordDict({protocol.CONFIG: protocol.config_record(config)}), dst_node_id=node,
                            message_type=protocol.PROFILE_QUERY, group_id=str(server_round)) for node in new_nodes]
        message_ids, replies = push_and_collect(self.grid, messages, self.timeout, self.lags)
        node_of_message = dict(zip(message_ids, new_nodes))
        first_contact = not self.clients
        reasons = []
        answered = set()
        for reply in replies:
            node = node_of_message[reply.metadata.reply_to_message_id]
            answered.add(node)
            if reply.has_error() and NO_PROFILE_HANDLER in reply.error.reason:
                info = ClientInfo(f"{STOCK_KEY_PREFIX}{node}", 1, -1, stock=True)  # size learnt from its first train reply
                self.stock.add(info.key)
                self.admit_node(server_round, node, info)
                continue
            if reply.has_error() and node in probes:
                log(logging.DEBUG, "absent client's node %s still unreachable: %s", node, reply.error.reason)
                continue
            if reply.has_error():
                key = key_in_reason(reply.error.reason)
                self.fail("error", reply.error.reason, key, node)
                reasons.append(first_line(reply.error.reason))
                log(logging.WARNING, "round %s: profile of client %s (node %s) failed: %s", server_round,
                    key if key is not None else "(no key)", node, first_line(reply.error.reason))
                self.profile_failed(server_round, node, key)
                continue
            try:
                info = parse_profile_reply(reply.content)
            except ReplyRejected as error:
                self.reject(server_round, None, error, node=node)
                reasons.append(str(error))
                self.profile_failed(server_round, node, None)
                continue
            owner = self.node_of_key.get(info.key)
            # Flower lists a dead node for a while: a key whose node missed its last
            # round (or is absent) may move to a new node
            owner_gone = info.key in self.absent or self.misses.get(info.key, 0) > 0
            if owner is not None and owner != node and owner in live and not owner_gone:
                self.contest(server_round, info.key, owner, node, info)
                continue
            self.admit_node(server_round, node, info)
        for node in new_nodes:
            if node not in answered and node not in probes:
                self.fail("timeout", f"no reply to the profile query within {self.timeout:g} s", None, node)
                self.profile_failed(server_round, node, None)
        if first_contact and not self.clients:
            raise RuntimeError(f"no client could load its data; the first error: {reasons[0] if reasons else 'no reply'}")
        if first_contact and self.options.newcomer_fraction > 0:
            keys = sorted(self.clients, key=natural)
            count = int(round(self.options.newcomer_fraction * len(keys)))
            rng = np.random.default_rng(self.options.seed + NEWCOMER_SEED_OFFSET)
            self.held_back = {keys[i] for i in rng.choice(len(keys), size=count, replace=False)}

    def admit_node(self, server_round: int, node: int, info: ClientInfo) -> None:
        if node in self.benched:
            log(logging.INFO, "round %s: client %s on node %s answers its profile again", server_round, info.key, node)
        # the device is back (on this node, or restarted on a new one): no longer absent
        for benched in [n for n, key in self.benched.items() if n == node or key == info.key]:
            del self.benched[benched]
        self.node_misses.pop(node, None)
        self.key_of_node.pop(self.node_of_key.get(info.key, -1), None)
        if info.key in self.absent or self.node_of_key.get(info.key) not in (None, node):
            log(logging.INFO, "round %s: client %s is back on node %s", server_round, info.key, node)
        self.absent.discard(info.key)
        self.misses[info.key] = 0
        if info.key in self.clients and info.key in self.stock:
            info = self.clients[info.key]  # keep the size learnt from its replies
        self.clients[info.key] = info
        self.node_of_key[info.key] = node
        self.key_of_node[node] = info.key

    def release_newcomers(self, server_round: int) -> None:
        """Simulated newcomers (``newcomer-fraction``) join at ``newcomer-round``."""
        if self.held_back and server_round >= self.options.newcomer_round:
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
        message_ids, replies = push_and_collect(self.grid, messages, self.timeout, self.lags)
        key_of_message = dict(zip(message_ids, keys))
        out: dict[str, RecordDict] = {}
        bytes_up = 0
        for reply in replies:
            key = key_of_message[reply.metadata.reply_to_message_id]
            if reply.has_error():
                self.fail("error", reply.error.reason, key, self.node_of_key.get(key))
                log(logging.WARNING, "round %s: client %s (node %s) failed: %s", server_round, key,
                    self.node_of_key.get(key), first_line(reply.error.reason))
                continue
            self.answered.add(key)
            if message_type != MessageType.EVALUATE:
                nbytes = protocol.message_array_bytes(reply.content)
                self.traffic.up += nbytes
                bytes_up += nbytes
                self.traffic.transmissions += 1
            out[key] = reply.content
        replied = {reply.metadata.reply_to_message_id for reply in replies}
        for message_id, key in zip(message_ids, keys):
            if not message_id:
                self.fail("unavailable", "its node is gone: the message was not delivered", key,
                          self.node_of_key[key])
                log(logging.WARNING, "client %s: its node %s is gone; the message was not delivered",
                    key, self.node_of_key[key])
            elif message_id not in replied:
                self.fail("timeout", f"no reply within {self.timeout:g} s", key, self.node_of_key[key])
        return out, bytes_up

    def train(self, server_round: int, asks: list[Ask]) -> Replies:
        """Send the asks; the validated replies in send order (rejections recorded)."""
        plan = {}
        for ask in asks:
            plan[ask.key] = (ask.model, {**self.train_config, **ask.config})
        received, bytes_up = self.exchange(server_round, plan, MessageType.TRAIN)
        replies = Replies(bytes_up=bytes_up)
        for ask in asks:
            if ask.key not in received:
                continue
            try:
                reply = parse_train_reply(received[ask.key], ask, self.shapes, stock=ask.key in self.stock)
            except ReplyRejected as error:
                self.reject(server_round, ask.key, error)
                continue
            if ask.key in self.stock:  # a stock client's size is known from its replies only
                self.clients[ask.key].num_examples = reply.num_examples
            if ask.config.get("phase") == "train":
                self.round_train_metrics.append((reply.num_examples, reply.metrics))
            replies.append(reply)
            self.accepted_train += 1
        return replies

    def evaluate(self, server_round: int) -> list[EvalRow]:
        models = self.strategy.evaluation_models(server_round)
        self.evaluate_sent = len(models)
        plan = {key: (model, {**self.evaluate_config, "server-round": server_round, "phase": "evaluate",
                              "cluster-id": cluster})
                for key, (cluster, model) in models.items()}
        received, _ = self.exchange(server_round, plan, MessageType.EVALUATE)
        rows = []
        for key, content in received.items():
            try:
                metrics, n = parse_eval_reply(content, key)
            except ReplyRejected as error:
                self.reject(server_round, key, error)
                continue
            self.round_eval_metrics.append((n, metrics))
            name = self.recorder.metric.name if self.recorder is not None else "accuracy"
            accuracy, loss = metric_value(metrics, name), metric_value(metrics, "loss")
            rows.append(EvalRow(key, models[key][0], self.clients[key].true_group, accuracy, loss, n))
        return rows

    def reject(self, server_round: int, key: str | None, error: ReplyRejected, node: int | None = None) -> None:
        node = self.node_of_key.get(key) if node is None and key is not None else node
        self.traffic.rejected.append({"client": key, "node": node, "kind": error.kind, "reason": first_line(str(error))})
        self.first_failure = self.first_failure or f"client {key} (node {node}): {first_line(str(error))}"
        self.traffic.fault(error.kind)
        if key is not None:
            self.failed_keys.add(key)
        log(logging.WARNING, "round %s: rejected reply of client %s (node %s): %s", server_round, key, node, error)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_state(self, server_round: int) -> dict[str, Any]:
        return {
            "round": server_round,
            "config": self.options.run_config,
            "model_shapes": {k: (list(s), str(d)) for k, (s, d) in self.shapes.items()},
            "algorithm": self.strategy.get_state(),
            "clients": self.clients,
            "stock": sorted(self.stock),
            "held_back": sorted(self.held_back),
            "absent": sorted(self.absent),
            "misses": dict(self.misses),
            "recorder": self.recorder.state() if self.recorder is not None else None,
        }

    def resume(self, directory: str) -> int:
        """Restore the state saved after a round; returns that round."""
        state = load_checkpoint(directory)
        check_compatible(state, self.options.run_config,
                         {k: (list(s), str(d)) for k, (s, d) in self.shapes.items()})
        self.strategy.set_state(state["algorithm"])
        self.clients.clear()
        self.clients.update(state["clients"])
        self.stock = set(state.get("stock", ()))
        self.held_back = set(state["held_back"])
        self.absent = set(state.get("absent", ()))
        self.misses = dict(state.get("misses", {}))
        if self.recorder is not None and state.get("recorder") is not None:
            self.recorder.restore(state["recorder"])
        log(logging.INFO, "resumed from %s after round %s", directory, state["round"])
        return int(state["round"])


# ---------------------------------------------------------------- metrics
# names a stock Flower ClientApp (quickstart-pytorch) reports for the same quantities
METRIC_ALIASES = {"accuracy": ("eval-accuracy", "eval_acc", "eval_accuracy", "accuracy"),
                  "loss": ("eval-loss", "eval_loss", "loss")}


def metric_value(metrics: dict[str, float], name: str) -> float | None:
    """The value of the declared metric ``name`` (``accuracy``, ``loss``, or any reply key)."""
    for key in METRIC_ALIASES.get(name, ()) + (name, f"eval-{name}", f"eval_{name}"):
        if key in metrics:
            return float(metrics[key])
    return None


def weighted_metrics(rows: list[tuple[int, dict[str, float]]]) -> MetricRecord:
    """Each metric averaged over the replies by their num-examples, as Flower's FedAvg does;
    ``num-examples`` is the total."""
    return average_metrics([{**m, "num-examples": n} for n, m in rows])


def average_metrics(records: list) -> MetricRecord:
    total = sum(int(r.get("num-examples", 0)) for r in records)
    if not total:
        return MetricRecord({})
    sums: dict[str, float] = {}
    for record in records:
        n = int(record.get("num-examples", 0))
        for key, value in record.items():
            if key != "num-examples" and isinstance(value, (int, float)) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0.0) + n * float(value)
    out = {key: value / total for key, value in sums.items()}
    out["num-examples"] = total
    return MetricRecord(out)


# ------------------------------------------------- Flower's single-phase hooks
def _driver(strategy: ClusteredStrategy, grid: Grid) -> RoundDriver:
    if strategy.driver is None or strategy.driver.grid is not grid:
        driver = strategy.driver = RoundDriver(strategy, strategy.run_options)
        driver.grid = grid
        if not strategy.models:
            raise StrategyParamsError("configure_train/configure_evaluate need an initialised strategy: "
                                      "call strategy.init(arrays) first, or use start()")
    return strategy.driver


def train_messages(strategy: ClusteredStrategy, server_round: int, config: dict, grid: Grid) -> list[Message]:
    """The train messages of ``Strategy.configure_train``: each placed trainer its cluster's model."""
    driver = _driver(strategy, grid)
    driver.train_config = config
    driver.discover(server_round)
    strategy.active = driver.active_keys()
    strategy.sampled = strategy.draw_sample(server_round)
    unplaced = [k for k in strategy.active if k not in strategy.assignment]
    if unplaced and (placing := strategy.admit(server_round, unplaced)) is not None:
        placing.close()  # placing needs clustering phases, which start() runs: they wait
    driver.pending_asks = {ask.key: ask for ask in strategy.train_asks(server_round, strategy.select_trainers(server_round))}
    return [Message(RecordDict({protocol.ARRAYS: protocol.to_array_record(ask.model),
                                protocol.CONFIG: protocol.config_record({**config, **ask.config})}),
                    dst_node_id=driver.node_of_key[ask.key], message_type=MessageType.TRAIN, group_id=str(server_round))
            for ask in driver.pending_asks.values()]


def aggregate_train_messages(strategy: ClusteredStrategy, server_round: int,
                             replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
    driver = strategy.driver
    asks = getattr(driver, "pending_asks", {}) if driver is not None else {}
    good: list[TrainReply] = []
    for message in replies:
        key = driver.key_of_node.get(message.metadata.src_node_id) if driver else None
        if key not in asks or message.has_error():
            continue
        try:
            good.append(parse_train_reply(message.content, asks[key], driver.shapes or strategy.shapes,
                                          stock=key in driver.stock))
        except ReplyRejected as error:
            driver.reject(server_round, key, error)
    strategy.aggregate_clusters(good)
    strategy.after_train(server_round, good)
    strategy.round_extra["train_loss"] = mean_train_loss(good)
    return driver.largest_cluster_record(), weighted_metrics([(r.num_examples, r.metrics) for r in good])


def evaluate_messages(strategy: ClusteredStrategy, server_round: int, config: dict, grid: Grid) -> list[Message]:
    driver = _driver(strategy, grid)
    models = strategy.evaluation_models(server_round)
    return [Message(RecordDict({protocol.ARRAYS: protocol.to_array_record(model),
                                protocol.CONFIG: protocol.config_record(
                                    {**config, "server-round": server_round, "phase": "evaluate",
                                     "cluster-id": cluster})}),
                    dst_node_id=driver.node_of_key[key], message_type=MessageType.EVALUATE, group_id=str(server_round))
            for key, (cluster, model) in models.items()]
