"""The round driver: the only server code that speaks Flower on a strategy's behalf.

``ClusteredStrategy.start`` hands itself to a ``RoundDriver``, which owns node discovery
and profiling, sending each client its payload, collecting replies within the round
``timeout``, validation, byte and fault counting, evaluation, recording and checkpoints.
The strategy decides what each client is asked for and folds validated replies into its
state; it never sees a message.

Why not Flower's ``Strategy.start`` loop: it threads one ArrayRecord through
configure/aggregate and sends every sampled node the same content. Clustered FL sends
each client its own cluster's model, asks some clients for partial layers, and needs a
profile probe before the first send; the loop below does that with Flower's Grid,
Message and records.

Stock Flower ClientApps (no profile, full weights back, Flower's metric names) are served
too, and cost no error: the profile is asked by an evaluate message of phase ``profile``
carrying the initial model, which a clusterfed client answers with its profile and a stock
ClientApp by evaluating the model. A stock client is keyed by the name it gives in that reply
(``stock_key``) or by its node id (``node-<id>``); its replies are taken as full weights, and
the arrays the strategy asked for are sliced from them here.
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
from clusterfed.strategies.base import (
    CAPABILITIES,
    LABEL_STATS,
    CapabilityError,
    ClientFailureError,
    ClusteredResult,
    ModelMismatchError,
    StrategyParamsError,
    mean_train_loss,
)
from clusterfed.strategies.exchange import Arrays, Ask, ClientInfo, Replies, TrainReply, natural

if TYPE_CHECKING:
    from clusterfed.strategies.base import ClusteredStrategy

# the held-back newcomers of a simulation are drawn with their own seed, apart from the
# algorithm's sampling
NEWCOMER_SEED_OFFSET = 7919
# Flower's ClientApp answers a message type it has no function for with this error (a stock
# ClientApp without an evaluate function, probed)
NO_EVALUATE_HANDLER = "No evaluate function registered"
STOCK_KEY_PREFIX = "node-"
# how a stock ClientApp may name itself in its evaluate reply: a number under one of these
# metrics, or a "client" ConfigRecord with a "client-key" (as clusterfed's clients send)
STOCK_KEY_METRICS = ("client-key", "partition-id")
# how clusterfed's ClientApp names itself in an error reply (clusterfed.client.app.ClientFailure)
KEY_IN_REASON = re.compile(r'\[client-key ("(?:[^"\\]|\\.)*")\]\s*')
# Flower's SuperNode wraps a ClientApp's exception as "<class 'X'>:<'message'>"
FLOWER_REASON = re.compile(r"^<class '([^']*)'>:<'(.*)'>$", re.DOTALL)
# Flower's simulation engine (Ray) wraps it again: a RayTaskError whose text is the client's
# traceback, then "The above exception was the direct cause", then Flower's ClientAppException
RAY_CAUSE = "The above exception was the direct cause of the following exception"
CLIENT_APP_EXCEPTION = "Exception ClientAppException occurred. Message: "
ANSI = re.compile(r"\x1b\[[0-9;]*m")
REASON_CHARS = 300
# rejection kinds that say the server's model and the client's differ
MISMATCH_KINDS = ("names", "shape", "dtype")


def key_in_reason(reason: str) -> str | None:
    """The client key a clusterfed ClientApp put into its error reply, if any."""
    match = KEY_IN_REASON.search(reason or "")
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1)))
    except ValueError:
        return None


def client_exception(text: str) -> str:
    """The client's own ``Type: message`` out of a Ray-wrapped reason: the exception line after
    the last frame of the client's traceback (before Flower re-raised it), else Flower's
    ``ClientAppException`` message; ``text`` itself when it is not Ray's."""
    if RAY_CAUSE in text:
        lines = text.split(RAY_CAUSE)[0].rstrip().splitlines()
        frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
        if frames:
            rest = lines[frames[-1] + 1:]
            while rest and rest[0].startswith("    "):  # the frame's source line(s)
                rest = rest[1:]
            if rest:
                kind, sep, message = "\n".join(rest).partition(": ")
                return f"{kind.rpartition('.')[2]}{sep}{message}"
    if CLIENT_APP_EXCEPTION in text:
        return text.split(CLIENT_APP_EXCEPTION, 1)[1]
    return text


def first_line(reason: str, lines: int = 1) -> str:
    """An error reply's reason as one line: ``Type: message`` (Flower's ``<class ...>:<'...'>``
    wrapper, the simulation engine's Ray wrapper and the client-key tag taken off), the
    first non-empty line (the first ``lines`` joined, for a message that must show more,
    e.g. torch's list of missing keys), at most ``REASON_CHARS`` characters a line."""
    text = ANSI.sub("", str(reason or ""))
    match = FLOWER_REASON.match(text.strip())
    if match is not None:
        inner = match.group(2)
        text = client_exception(inner) if RAY_CAUSE in inner or CLIENT_APP_EXCEPTION in inner else \
            f"{match.group(1).rpartition('.')[2]}: {inner}"
    text = KEY_IN_REASON.sub("", text, count=1)
    parts = [part.strip() for part in text.splitlines() if part.strip()][:lines]
    return " ".join(part if len(part) <= REASON_CHARS else part[:REASON_CHARS - 1] + "…" for part in parts)


# what a ClientApp's error says when the arrays it was sent do not load into its model (torch's
# load_state_dict, or a shape error of the client's own loading)
LOAD_ERROR = re.compile(r"state_dict|size mismatch|Missing key|Unexpected key|shape mismatch", re.IGNORECASE)


def is_profile(content: RecordDict) -> bool:
    """Whether a reply to the profile probe is a clusterfed client's profile (its client
    record lists its capabilities), not a stock ClientApp's evaluation."""
    client = content.get(protocol.CLIENT) if hasattr(content, "get") else None
    return client is not None and protocol.CAPABILITIES_KEY in client


def stock_key(content: RecordDict, node: int) -> str:
    """The key of a stock ClientApp from its evaluate reply: a ``client`` ConfigRecord's
    ``client-key``, else a ``client-key`` or ``partition-id`` metric (a number), else
    ``node-<node id>``."""
    client = content.get(protocol.CLIENT) if hasattr(content, "get") else None
    if client is not None and str(client.get("client-key", "")).strip():
        return str(client["client-key"])
    metrics = content.get(protocol.METRICS) if hasattr(content, "get") else None
    for name in STOCK_KEY_METRICS:
        value = metrics.get(name) if metrics is not None else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
            return str(int(value))
    return f"{STOCK_KEY_PREFIX}{node}"


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
        self.stock: set[str] = set()  # keys of stock Flower ClientApps (no profile)
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
        self.probe_record = ArrayRecord()  # the initial model, sent with the profile probe
        self.probe_bytes = 0  # array bytes the profile probes carried
        self.failing_rounds = 0  # rounds in a row in which train was asked and no reply accepted
        self.round_asked = 0  # train replies asked for this round
        self.round_accepted = 0  # and accepted
        self.round_trainers: set[str] = set()  # clients asked to train this round (a client may be asked twice)
        # per client: failures in a row and the last reason (status.json's "failing")
        self.failing: dict[str, tuple[int, str]] = {}
        # a resumed run: the client each node served before the stop (from the checkpoint),
        # to name a node that fails before it says its key again
        self.last_key_of_node: dict[int, str] = {}

    # ------------------------------------------------------------ the loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> ClusteredResult:
        if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 1:
            raise StrategyParamsError(f"{self.strategy.name}: num_rounds = {num_rounds!r}: a run needs at least "
                                      f"one round (an integer >= 1)")
        self.grid, self.timeout = grid, float(timeout)
        if self.options.deployment is None:
            self.deployment = not is_simulation(grid)
        self.train_config = dict(train_config or {})
        self.evaluate_config = dict(evaluate_config or {})
        self.strategy.check_train_config(self.train_config)
        self.strategy.train_config = self.train_config
        theta0 = protocol.from_array_record(initial_arrays)
        if not theta0:
            raise StrategyParamsError(f"{self.strategy.name}: initial_arrays is empty: give the model's "
                                      f"ArrayRecord (e.g. ArrayRecord(model.state_dict()))")
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in theta0.items()}
        self.probe_record = protocol.to_array_record(theta0)
        self.wait_for_nodes()
        log(logging.INFO, "%s: %d rounds, %d arrays (%.2f MB)", type(self.strategy).__name__, num_rounds,
            len(theta0), sum(v.nbytes for v in theta0.values()) / 1e6)
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
            self.round_asked = self.round_accepted = 0
            self.round_trainers = set()
            self.discover(server_round)
            if server_round == first_round:
                if self.options.resume_from:
                    self.absent_until_seen(server_round)
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
                extra["absent"] = self.absent_devices()
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
            self.log_round(server_round, num_rounds, result)
            self.strategy.training_failed = None
            self.check_failing(server_round, num_rounds)
            if self.options.checkpoint and self.recorder is not None:
                save_checkpoint(self.recorder.out, self.checkpoint_state(server_round))
        models = self.strategy.cluster_models()
        result.cluster_arrays = {c: protocol.to_array_record(m) for c, m in sorted(models.items())}
        result.arrays = self.largest_cluster_record()
        result.assignment = dict(self.strategy.assignment)
        result.clustering = self.strategy.final_clusters()
        result.traffic["probe_bytes_down"] = self.probe_bytes
        return result

    def log_round(self, server_round: int, num_rounds: int, result: ClusteredResult) -> None:
        """The round's one INFO line: replies and failures, clusters, mean train loss and the
        clients' evaluate metrics (averaged by num-examples, as Flower's FedAvg does)."""
        loss = self.strategy.round_extra.get("train_loss")
        clusters = len({self.strategy.assignment[k] for k in self.active_keys() if k in self.strategy.assignment})
        failed = len(self.failed_keys)
        evaluated = {k: v for k, v in result.evaluate_metrics_clientapp.get(server_round, {}).items()
                     if k not in ("num-examples", *STOCK_KEY_METRICS)}
        trainers = len(self.round_trainers)
        several = f" from {trainers} clients (some asked more than once)" if self.round_asked > trainers else ""
        parts = [f"[ROUND {server_round}/{num_rounds}] train: {self.round_accepted} of {self.round_asked} replies "
                 f"accepted{several}" + (f", {failed} client(s) failed" if failed else ""),
                 f"{clusters} cluster{'s' if clusters != 1 else ''}"]
        if loss is not None:
            parts.append(f"train loss {loss:.4g}")
        if evaluated:
            parts.append("evaluate " + ", ".join(f"{k} {float(v):.4g}" for k, v in sorted(evaluated.items())))
        log(logging.INFO, "%s", "; ".join(parts))

    def check_failing(self, server_round: int, num_rounds: int) -> None:
        """Stop the run (``ClientFailureError``, quoting the clients' own error text) when train
        was asked and no reply accepted in ``absent-after`` rounds in a row, or in every round of
        a run that ends so. In a deployment, clients that did not reply in time are absent,
        not failing: only error replies and rejected replies count there."""
        failures = self.traffic.failed + self.traffic.rejected
        if self.deployment:
            failures = [f for f in failures if f["kind"] not in ("timeout", "unavailable")]
        last_reason = {f["client"]: f["reason"] for f in failures if f.get("client") is not None}
        for key, reason in last_reason.items():  # rounds in a row, not replies
            self.failing[key] = (self.failing.get(key, (0, ""))[0] + 1, reason)
        for key in self.answered - self.failed_keys:
            self.failing.pop(key, None)
        if not self.round_asked or self.round_accepted or not failures:
            self.failing_rounds = 0
            return
        self.failing_rounds += 1
        if self.failing_rounds < self.options.absent_after and not (server_round == num_rounds and not self.accepted_train):
            return
        quoted: dict[str, list[str]] = {}
        for failure in failures:
            quoted.setdefault(failure["reason"], []).append(str(failure["client"] if failure["client"] is not None
                                                                else f"node {failure['node']}"))
        causes = "; ".join(f"{', '.join(who[:3])}{' …' if len(who) > 3 else ''}: {reason}"
                           for reason, who in list(quoted.items())[:3])
        self.strategy.training_failed = (f"no client's train reply was accepted in {self.failing_rounds} round(s) in a "
                                         f"row (to round {server_round}); the clients' errors: {causes}")
        raise ClientFailureError(self.strategy.training_failed)

    def absent_devices(self) -> list[dict[str, Any]]:
        """Clients marked absent and nodes whose profile kept failing, one shape:
        ``{"client": key or None, "node": node id or None}``."""
        devices = [{"client": key, "node": self.node_of(key)} for key in sorted(self.absent, key=natural)]
        return devices + [{"client": key, "node": node} for node, key in sorted(self.benched.items())
                          if key not in self.absent]

    def node_of(self, key: str) -> int | None:
        """The node a client is on, or the node whose failing profile named it."""
        if key in self.node_of_key:
            return self.node_of_key[key]
        return next((node for node, named in self.benched.items() if named == key), None)

    def device_report(self) -> dict[str, Any]:
        """For status.json: the devices absent at the end and those whose last replies failed
        (``{"client", "node", "failures": in a row, "reason": the last}``)."""
        failing = [{"client": key, "node": self.node_of(key), "failures": count, "reason": reason}
                   for key, (count, reason) in sorted(self.failing.items(), key=lambda item: natural(item[0]))]
        return {"absent": self.absent_devices(), "failing": failing}

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
            raise CapabilityError(
                f"strategy {self.strategy.name!r} needs clients capable of {what}, but {len(self.stock)} client(s) "
                f"answer as a stock Flower ClientApp (no profile): {nodes}. Build the ClientApp with "
                f"clusterfed.client (see the README, 'Use clusterfed in your own Flower app')"
                + (f", or {self.strategy.stock_alternative}." if self.strategy.stock_alternative else "."))

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
            clients_known=len(active), clients_absent=len(self.absent_devices()),
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
                    "row: marked absent, not messaged until it answers a profile probe again",
                    server_round, key, self.node_of_key.get(key), self.misses[key])

    def fail(self, kind: str, reason: str, key: str | None, node: int | None) -> None:
        """One failure (an error reply, no reply, an undeliverable message), named."""
        named = self.last_key_of_node.get(node) if key is None else key  # a name, not a miss of that client
        self.traffic.failures += 1
        self.traffic.fault(kind)
        self.traffic.failed.append({"client": named, "node": node, "kind": kind, "reason": first_line(reason)})
        if key is not None:
            self.failed_keys.add(key)

    def absent_until_seen(self, server_round: int) -> None:
        """A resumed run knows its clients from the checkpoint, but not their nodes (node ids
        are not state): those whose device has not answered the first probe are absent, never
        messaged without a node, until a probe of theirs brings them back."""
        unseen = sorted((k for k in self.clients if k not in self.node_of_key and k not in self.absent), key=natural)
        if unseen:
            self.absent.update(unseen)
            log(logging.WARNING, "round %s: resumed run: %d client(s) not connected yet, absent until they answer "
                "a profile probe: %s", server_round, len(unseen), ", ".join(unseen[:10]) + (" …" if len(unseen) > 10
                                                                                           else ""))

    def profile_failed(self, server_round: int, node: int, key: str | None) -> None:
        """A node whose profile failed is never admitted; ``absent-after`` failures in a row
        mark it absent: it is then only asked for its profile again, and a failure of that is
        not a new fault."""
        key = self.last_key_of_node.get(node) if key is None else key
        self.node_misses[node] = self.node_misses.get(node, 0) + 1
        if self.node_misses[node] >= self.options.absent_after and node not in self.benched:
            self.benched[node] = key
            log(logging.WARNING, "round %s: client %s (node %s) failed its profile probe in %d rounds in a row: "
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
        """The probe's config: what an evaluate message carries (a stock ClientApp evaluates
        it), the train config (a clusterfed client builds its data from it) and the phase."""
        config = {**self.evaluate_config, **self.train_config}
        config.update({"server-round": server_round, "phase": protocol.PROFILE_PHASE,
                       "label-stats": LABEL_STATS in self.strategy.requires()})
        return config

    def probe_messages(self, server_round: int, nodes: list[int]) -> list[Message]:
        """The profile probe of each node: an evaluate message of phase ``profile``; it carries
        the initial model unless the node's client is known to be a clusterfed client (a
        stock ClientApp evaluates the model it is sent, and would fail without one)."""
        config = protocol.config_record(self.profile_config(server_round))
        helper_nodes = {self.node_of_key[k] for k in self.clients if k not in self.stock and k in self.node_of_key}
        helper_nodes |= {n for n, key in self.benched.items() if key is not None}  # it named itself: a helper
        messages = []
        for node in nodes:
            content = RecordDict({protocol.CONFIG: config})
            if node not in helper_nodes:
                content[protocol.ARRAYS] = self.probe_record
                self.probe_bytes += protocol.message_array_bytes(content)
            messages.append(Message(content, dst_node_id=node, message_type=MessageType.EVALUATE,
                                    group_id=str(server_round)))
        return messages

    def discover(self, server_round: int) -> None:
        """Profile nodes seen for the first time: stable key, size, label stats. A node
        whose key is known (a restarted device, a resumed run) takes that client's place,
        unless the key's node is listed and answered in its last round (a duplicate key).
        A node whose reply to the probe is not a profile is a stock Flower ClientApp: keyed
        by the name it gives (``stock_key``) or its node id. Deployment: nodes that join
        after the first round are profiled here and then placed by the algorithm's
        ``admit``; an absent client's node that is still listed is asked again."""
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
        messages = self.probe_messages(server_round, new_nodes)
        message_ids, replies = push_and_collect(self.grid, messages, self.timeout, self.lags)
        node_of_message = dict(zip(message_ids, new_nodes))
        first_contact = not self.clients
        reasons, load_errors = [], []  # every failed probe; those whose arrays did not load
        answered = set()
        for reply in replies:
            node = node_of_message[reply.metadata.reply_to_message_id]
            answered.add(node)
            if reply.has_error() and NO_EVALUATE_HANDLER in reply.error.reason:
                self.admit_stock(server_round, node, f"{STOCK_KEY_PREFIX}{node}")
                continue
            if reply.has_error() and node in probes:
                log(logging.DEBUG, "absent client's node %s still unreachable: %s", node, reply.error.reason)
                continue
            if reply.has_error():
                key = key_in_reason(reply.error.reason)
                self.fail("error", reply.error.reason, key, node)
                reasons.append(first_line(reply.error.reason))
                if LOAD_ERROR.search(reply.error.reason):
                    load_errors.append(f"Client on node {node}: {first_line(reply.error.reason, lines=4)}")
                log(logging.WARNING, "round %s: profile of %s failed: %s", server_round,
                    f"client {key} (node {node})" if key is not None else f"node {node}", first_line(reply.error.reason))
                self.profile_failed(server_round, node, key)
                continue
            if not is_profile(reply.content):
                self.admit_stock(server_round, node, stock_key(reply.content, node), live)
                continue
            try:
                info = parse_profile_reply(reply.content)
            except ReplyRejected as error:
                self.reject(server_round, None, error, node=node)
                reasons.append(str(error))
                self.profile_failed(server_round, node, None)
                continue
            self.claim(server_round, node, info, live)
        for node in new_nodes:
            if node not in answered and node not in probes:
                self.fail("timeout", f"no reply to the profile probe within {self.timeout:g} s", None, node)
                self.profile_failed(server_round, node, None)
        if first_contact and not self.clients:
            if load_errors:  # the probe evaluates start()'s initial_arrays: they do not load
                raise ModelMismatchError(
                    f"the clients cannot load the initial arrays: start()'s initial_arrays are not the model "
                    f"the ClientApp trains; give start() that model's arrays (ArrayRecord(Net().state_dict())). "
                    f"{load_errors[0]}")
            raise ClientFailureError(f"no client could be profiled; the first error: "
                                     f"{reasons[0] if reasons else 'no reply'}")
        if first_contact and self.options.newcomer_fraction > 0:
            keys = sorted(self.clients, key=natural)
            count = int(round(self.options.newcomer_fraction * len(keys)))
            rng = np.random.default_rng(self.options.seed + NEWCOMER_SEED_OFFSET)
            self.held_back = {keys[i] for i in rng.choice(len(keys), size=count, replace=False)}

    def admit_stock(self, server_round: int, node: int, key: str, live: list[int] | None = None) -> None:
        """A stock ClientApp: its size is learnt from its first train reply."""
        self.stock.add(key)
        self.claim(server_round, node, ClientInfo(key, 1, -1, stock=True), live or [])

    def claim(self, server_round: int, node: int, info: ClientInfo, live: list[int]) -> None:
        """``node`` says it is client ``info.key``: admitted, unless another listed node that
        answered its last round holds that key (then both wait: a duplicate key)."""
        owner = self.node_of_key.get(info.key)
        # Flower lists a dead node for a while: a key whose node missed its last
        # round (or is absent) may move to a new node
        owner_gone = info.key in self.absent or self.misses.get(info.key, 0) > 0
        if owner is not None and owner != node and owner in live and not owner_gone:
            self.contest(server_round, info.key, owner, node, info)
            return
        self.admit_node(server_round, node, info)

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
        mismatches = []
        self.round_asked += len(asks)
        self.round_trainers.update(ask.key for ask in asks)
        for ask in asks:
            if ask.key not in received:
                continue
            try:
                reply = parse_train_reply(received[ask.key], ask, self.shapes, stock=ask.key in self.stock)
            except ReplyRejected as error:
                self.reject(server_round, ask.key, error)
                if error.kind in MISMATCH_KINDS:
                    mismatches.append((ask.key, error))
                continue
            if ask.key in self.stock:  # a stock client's size is known from its replies only
                self.clients[ask.key].num_examples = reply.num_examples
            if ask.config.get("phase") == "train":
                self.round_train_metrics.append((reply.num_examples, reply.metrics))
            replies.append(reply)
            self.accepted_train += 1
            self.round_accepted += 1
        if mismatches and not self.accepted_train:
            key, error = mismatches[0]
            raise ModelMismatchError(
                f"the clients' model does not match initial_arrays: client {key} (node {self.node_of_key.get(key)}) "
                f"replied {error} ({len(mismatches)} of {len(asks)} replies differ so, none matched); give start() "
                f"the arrays of the model the ClientApp trains")
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
            self.round_eval_metrics.append((n, {k: v for k, v in metrics.items() if k not in STOCK_KEY_METRICS}))
            name = self.recorder.metric.name if self.recorder is not None else "accuracy"
            accuracy, loss = metric_value(metrics, name), metric_value(metrics, "loss")
            rows.append(EvalRow(key, models[key][0], self.clients[key].true_group, accuracy, loss, n))
        return rows

    def reject(self, server_round: int, key: str | None, error: ReplyRejected, node: int | None = None) -> None:
        node = self.node_of_key.get(key) if node is None and key is not None else node
        self.traffic.rejected.append({"client": key, "node": node, "kind": error.kind, "reason": first_line(str(error))})
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
            "nodes": dict(self.node_of_key),
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
        self.last_key_of_node = {node: key for key, node in state.get("nodes", {}).items()}
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
        driver.probe_record = protocol.to_array_record(strategy.theta0)
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
