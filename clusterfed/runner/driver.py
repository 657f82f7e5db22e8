"""The round driver: the only server code that speaks Flower on a strategy's behalf.

``ClusteredStrategy.start`` hands itself to a ``RoundDriver``, which runs the rounds with
three parts beside it: ``Membership`` (who takes part: discovery, profiles, absence,
duplicate keys), ``Link`` (sending each client its payload, collecting replies within the
round ``timeout``, byte and fault counting) and scoring (evaluation rows, metrics, the
round's record). The strategy decides what each client is asked for and folds validated
replies into its state; it never sees a message.

Why not Flower's ``Strategy.start`` loop: it threads one ArrayRecord through
configure/aggregate and sends every sampled node the same content. Clustered FL sends
each client its own cluster's model, asks some clients for partial layers, and needs a
profile probe before the first send; the loop below does that with Flower's Grid,
Message and records.

Stock Flower ClientApps (no profile, full weights back, Flower's metric names) are served
too, and cost no error (``clusterfed.runner.membership``); their replies are taken as full
weights, and the arrays the strategy asked for are sliced from them here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.results import EvalRow, RunRecorder, with_true_groups
from clusterfed.runner.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from clusterfed.runner.membership import Membership
from clusterfed.runner.newcomers import SimulatedNewcomers
from clusterfed.runner.replies import STOCK_KEY_METRICS
from clusterfed.runner.scoring import eval_rows, record_round, score_reports, weighted_metrics
from clusterfed.runner.transport import is_simulation, wait_for_nodes
from clusterfed.runner.validation import ReplyRejected, parse_train_reply
from clusterfed.core.contract import ClientFailureError, ClusteredResult, ModelMismatchError, StrategyParamsError
from clusterfed.core.exchange import Ask, Diagnostics, Replies, RoundResult, SecureTrain, Steps
from clusterfed.explain.generic import ending_words, round_words
from clusterfed.runner.secure import secure_exchange
from clusterfed.strategies.base import ClusteredStrategy

# rejection kinds that say the server's model and the client's differ
MISMATCH_KINDS = ("names", "shape", "dtype")


@dataclass
class RunOptions:
    """What an application adds around a strategy (the built-in app sets all of them; a
    user's own ServerApp needs none): recording, checkpoints, membership, simulated
    newcomers."""

    recorder: RunRecorder | None = None
    deployment: bool | None = None  # None: a grid that is not a simulation's is a deployment
    checkpoint: bool = False  # write the full state after every round into the recorder's folder
    resume_from: str = ""
    resume_state: dict[str, Any] | None = None  # the checkpoint of resume_from, loaded and checked (preflight)
    absent_after: int = 2
    probe_timeout: float = 120.0  # seconds the run's first profile probe waits (at least the round timeout)
    newcomer_fraction: float = 0.0
    newcomer_round: int = 10
    seed: int = 0
    # the flat run config a checkpoint is checked against on resume
    run_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpenRound:
    """A round the driver opened (``open_round``): the strategy's round, the assignment it
    started from (what its reports are scored against) and the active client keys it was
    handed (whom evaluation samples from)."""

    steps: Steps
    assignment_before: dict[str, int]
    active: list[str] = field(default_factory=list)


class RoundDriver:
    """Drives one strategy (``ClusteredStrategy``) over a Flower Grid for ``num_rounds`` rounds."""

    def __init__(self, strategy: ClusteredStrategy, options: RunOptions | None = None):
        self.options = options or RunOptions(seed=strategy.params.seed)
        self.strategy = strategy
        self.recorder = self.options.recorder
        self.newcomers = SimulatedNewcomers(self.options.newcomer_fraction, self.options.newcomer_round,
                                            self.options.seed)
        self.members = Membership(strategy, self.newcomers, self.options.absent_after, self.options.probe_timeout)
        self.link = self.members.link
        self.members.deployment = bool(self.options.deployment)
        self.shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.train_config: dict[str, Any] = {}
        self.evaluate_config: dict[str, Any] = {}
        self.completed_rounds = 0
        self.accepted_train = 0  # train replies accepted over the run
        self.failing_rounds = 0  # rounds in a row in which train was asked and no reply accepted
        self.training_failed: str | None = None  # why the run stopped with no train reply accepted
        self.pending = None  # Flower's single-phase hooks: the round between configure_train and aggregate_train
        # the active client keys the last opened round was handed: whom its evaluation samples from
        # (Flower's configure_evaluate comes after the round is over)
        self.round_active: list[str] = []
        self.new_round()

    def new_round(self) -> None:
        self.link.new_round()
        self.round_train_metrics: list[tuple[str, int, dict[str, float]]] = []
        self.round_eval_metrics: list[tuple[str, int, dict[str, float]]] = []
        self.round_asked = self.round_accepted = 0  # train replies asked for this round, and accepted
        self.round_trainers: set[str] = set()  # clients asked to train this round (a client may be asked twice)
        self.round_averaged: set[str] = set()  # clients whose training (not for evidence only) was accepted
        self.evaluate_sent = 0  # clients sent an evaluate message this round
        self.strategy_seconds = 0.0  # server-side compute inside the strategy's steps this round

    @property
    def grid(self) -> Grid | None:
        return self.link.grid

    # ------------------------------------------------------------ the loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None, should_stop: Callable[[int, Result], bool] | None = None) -> ClusteredResult:
        """The run (Flower's ``Strategy.start``); ``should_stop(round, result)`` is asked after
        every round, the last included, whether to end the run there (Flower 1.43's early stop,
        asked where its own loop asks it)."""
        first_round = self.begin(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config)
        result = ClusteredResult()
        if evaluate_fn is not None and first_round == 1:  # as Flower's start: the initial model, round 0
            server_metrics = evaluate_fn(0, initial_arrays)
            if server_metrics is not None:
                result.evaluate_metrics_serverapp[0] = server_metrics
        for server_round in range(first_round, num_rounds + 1):
            self.play_round(server_round, first_round, num_rounds, result, evaluate_fn)
            if should_stop is not None and should_stop(server_round, result):
                ending = ending_words(self.strategy, self.members.table())
                log(logging.INFO, "[ROUND %d/%d] should_stop returned True: the run stops here%s", server_round,
                    num_rounds, f"; {ending}" if ending else "")
                break
        models = self.strategy.cluster_models()
        result.cluster_arrays = {c: protocol.to_array_record(m) for c, m in sorted(models.items())}
        result.arrays = self.largest_cluster_record()
        result.assignment = self.members.final_assignment()
        result.clustering = with_true_groups(self.strategy.final_clusters(clients=self.members.table()),
                                             {k: c.true_group for k, c in self.members.clients.items()})
        result.traffic["probe_bytes_down"] = self.members.probe_bytes
        return result

    def begin(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int, timeout: float,
              train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None) -> int:
        """Check the arguments, wait for the nodes, initialise or resume the strategy;
        returns the first round to play."""
        if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 1:
            raise StrategyParamsError(f"{self.strategy.name}: num_rounds = {num_rounds!r}: a run needs at least "
                                      f"one round (an integer >= 1)")
        self.link.grid, self.link.timeout = grid, float(timeout)
        if self.options.deployment is None:
            self.members.deployment = not is_simulation(grid)
        self.set_configs(dict(train_config or {}), dict(evaluate_config or {}))
        self.strategy.check_train_config(self.train_config)
        theta0 = protocol.from_array_record(initial_arrays)
        if not theta0:
            raise StrategyParamsError(f"{self.strategy.name}: initial_arrays is empty: give the model's "
                                      f"ArrayRecord (e.g. ArrayRecord(model.state_dict()))")
        self.shapes = {k: (tuple(v.shape), v.dtype) for k, v in theta0.items()}
        self.members.probe_record = protocol.to_array_record(theta0)
        self.wait_for_nodes()
        log(logging.INFO, "%s: %d rounds, %d arrays (%.2f MB)", type(self.strategy).__name__, num_rounds,
            len(theta0), sum(v.nbytes for v in theta0.values()) / 1e6)
        if self.options.resume_from:
            return self.resume(self.options.resume_from) + 1
        self.strategy.init(theta0)
        return 1

    def set_configs(self, train_config: dict[str, Any], evaluate_config: dict[str, Any]) -> None:
        self.train_config, self.evaluate_config = train_config, evaluate_config
        self.members.probe_config = {**evaluate_config, **train_config}

    # ------------------------------------------------------------ the round's envelope
    # (the same for ``start``'s rounds and Flower's single-phase hooks: clusterfed.runner.single_phase)
    def open_round(self, server_round: int, *, check_capabilities: bool, resumed: bool = False,
                   one_exchange: bool = False) -> OpenRound:
        """A round begins: the round's counters reset, simulated newcomers released, the nodes
        discovered (profiles; the population is checked against the dp_* settings before any
        probe is sent), on a resumed run's first round its unseen clients absent, the
        capabilities checked; returns the strategy's round over the active clients (not
        started yet) with the assignment it starts from; ``one_exchange``: Flower's single-phase
        hooks drive it, so steps that would ask a further exchange leave it out."""
        self.new_round()
        self.newcomers.release(server_round)
        self.members.discover(server_round)
        if resumed:
            self.members.absent_until_seen(server_round)
        if check_capabilities:
            self.members.check_capabilities()
        assignment_before = dict(self.strategy.assignment)
        self.round_active = self.members.active_keys()
        steps = self.strategy.round_steps(server_round, self.round_active, self.train_config, self.members.table(),
                                          one_exchange=one_exchange)
        return OpenRound(steps, assignment_before, list(self.round_active))

    def close_round(self, opened: OpenRound, result: RoundResult) -> Diagnostics:
        """A round is over: its reports scored against the true groups; returns its diagnostics."""
        score_reports(result.reports, self.members.clients, opened.assignment_before)
        self.link.settle(self.round_averaged)
        return result.diagnostics

    def plan(self, asks: list[Ask]) -> dict[str, tuple[Any, dict[str, Any]]]:
        """What each asked client is sent: the model its ask names, the train config under the ask's own."""
        return {ask.key: (ask.model, {**self.train_config, **ask.config}) for ask in asks}

    def play_round(self, server_round: int, first_round: int, num_rounds: int, result: ClusteredResult,
                   evaluate_fn: Any) -> None:
        """One round: membership, the strategy's steps, evaluation, the record, the checkpoint."""
        started = time.perf_counter()
        resuming = bool(self.options.resume_from or self.options.resume_state is not None)
        opened = self.open_round(server_round, check_capabilities=server_round == first_round,
                                 resumed=server_round == first_round and resuming)
        diagnostics = self.close_round(opened, self.drive(server_round, opened.steps))
        evals = self.evaluate(server_round, opened.active)
        self.members.update_absence(server_round)
        traffic = self.link.traffic
        result.traffic["bytes_down"] += traffic.down
        result.traffic["bytes_up"] += traffic.up
        result.traffic["eval_bytes_down"] += traffic.eval_down
        result.train_metrics_clientapp[server_round] = weighted_metrics(self.round_train_metrics)
        result.evaluate_metrics_clientapp[server_round] = weighted_metrics(self.round_eval_metrics)
        if evaluate_fn is not None:
            server_metrics = evaluate_fn(server_round, self.largest_cluster_record())
            if server_metrics is not None:
                result.evaluate_metrics_serverapp[server_round] = server_metrics
        if self.recorder is not None:
            self.record(server_round, evals, time.perf_counter() - started, diagnostics)
        self.completed_rounds = server_round
        words = round_words(self.strategy, server_round, num_rounds, diagnostics.get("decision"), self.members.table(),
                            first=server_round == 1 == first_round)  # clusterfed.explain.generic
        self.log_round(server_round, num_rounds, result, diagnostics.get("train_loss"), words)
        self.check_failing(server_round, num_rounds)
        if self.options.checkpoint and self.recorder is not None:
            save_checkpoint(self.recorder.out, self.checkpoint_state(server_round))

    def extra_columns(self, diagnostics: Diagnostics) -> dict[str, Any]:
        """What rounds.jsonl holds beyond the recorder's own columns: the strategy's
        diagnostics and, where there are any, reply lags, absent devices and duplicate keys."""
        extra = dict(diagnostics)
        members = self.members
        if members.deployment and self.link.lags:
            extra["reply_lag_seconds"] = round(float(np.mean(self.link.lags)), 3)
        if members.absent or members.benched:
            extra["absent"] = members.absent_devices()
        if members.duplicates:
            extra["duplicate_keys"] = [{"client": key, "nodes": sorted(claim)}
                                       for key, claim in sorted(members.duplicates.items())]
        return extra

    def record(self, server_round: int, evals: list[EvalRow], seconds: float, diagnostics: Diagnostics) -> dict[str, Any]:
        members = self.members
        return record_round(self.recorder, server_round, evals=evals, active=members.active_keys(),
                            clients=members.clients, assignment=self.strategy.assignment, traffic=self.link.traffic,
                            seconds=seconds, clustering_seconds=self.strategy_seconds,
                            extra=self.extra_columns(diagnostics), absent=len(members.absent_devices()),
                            evaluated=self.evaluate_sent)

    def log_round(self, server_round: int, num_rounds: int, result: ClusteredResult, loss: float | None, decision: str) -> None:
        """The round's one INFO line: replies and failures, clusters, the mean train ``loss``,
        the clients' evaluate metrics (averaged by num-examples, as Flower's FedAvg does) and
        the strategy's ``decision`` in its own words (what it compared, why one cluster)."""
        assignment = self.strategy.assignment
        clusters = len({assignment[k] for k in self.members.active_keys() if k in assignment})
        failed = len(self.link.failed_keys)
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
            parts.append(f"evaluate over {len(self.round_eval_metrics)} of {len(self.members.known_keys())} clients: "
                         + ", ".join(f"{k} {float(v):.4g}" for k, v in sorted(evaluated.items())))
        if decision:
            parts.append(decision)
        log(logging.INFO, "%s", "; ".join(parts))

    def check_failing(self, server_round: int, num_rounds: int) -> None:
        """Stop the run (``ClientFailureError``, quoting the clients' own error text) when train
        was asked and no reply accepted in ``absent-after`` rounds in a row, or in every round of
        a run that ends so. In a deployment, clients that did not reply in time are absent,
        not failing: only error replies and rejected replies count there."""
        failures = self.link.traffic.failed + self.link.traffic.rejected
        if self.members.deployment:
            failures = [f for f in failures if f["kind"] not in ("timeout", "unavailable")]
        self.members.note_failures(failures)
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
        self.training_failed = (f"no client's train reply was accepted in {self.failing_rounds} round(s) in a "
                                         f"row (to round {server_round}); the clients' errors: {causes}")
        raise ClientFailureError(self.training_failed)

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
        online = wait_for_nodes(self.grid, needed, self.link.timeout)
        if online < needed:
            raise StrategyParamsError(f"only {online} of min-available-nodes = {needed} nodes connected "
                                      f"within {self.link.timeout:g} s")

    # ------------------------------------------------------------ exchange
    def drive(self, server_round: int, steps: Steps) -> RoundResult:
        """Run one round of the strategy: each list of asks it yields is sent, and the
        validated replies are sent back into it, until the round is done; returns what the
        round returned (its ``RoundResult``). The time spent inside the strategy's steps (not
        waiting for clients) is the round's ``strategy_seconds``."""
        started = time.perf_counter()
        try:
            asks = next(steps)
            while True:
                self.strategy_seconds += time.perf_counter() - started
                replies = (secure_exchange(self, server_round, asks) if isinstance(asks, SecureTrain)
                           else self.train(server_round, asks))
                started = time.perf_counter()
                asks = steps.send(replies)
        except StopIteration as done:
            self.strategy_seconds += time.perf_counter() - started
            return done.value

    def train(self, server_round: int, asks: list[Ask]) -> Replies:
        """Send the asks; the validated replies in send order (rejections recorded)."""
        received, bytes_up = self.link.send(server_round, self.plan(asks), MessageType.TRAIN,
                                            evidence={ask.key for ask in asks if ask.evidence})
        return self.accept(server_round, asks, received, bytes_up)

    def accept(self, server_round: int, asks: list[Ask], received: dict[str, Any], bytes_up: int = 0) -> Replies:
        """The replies ``received`` (client key -> content) to ``asks`` that pass validation, in
        send order: rejections recorded, a stock client's size learnt, the round's train
        metrics and counts kept; ModelMismatchError when replies differ from the model and none
        matched. ``start``'s exchanges and Flower's single-phase hooks both end here."""
        replies = Replies(bytes_up=bytes_up)
        mismatches = []
        self.round_asked += len(asks)
        self.round_trainers.update(ask.key for ask in asks)
        stock = self.members.stock
        for ask in asks:
            if ask.key not in received:
                continue
            try:
                reply = parse_train_reply(received[ask.key], ask, self.shapes, stock=ask.key in stock)
            except ReplyRejected as error:
                self.link.reject(server_round, ask.key, error, evidence=ask.evidence)
                if error.kind in MISMATCH_KINDS:
                    mismatches.append((ask.key, error))
                continue
            if ask.key in stock:  # a stock client's size is known from its replies only
                self.members.clients[ask.key].num_examples = reply.num_examples
            # the trainings the round averages (one per client): not one for evidence only, and
            # not a clustering step's; a name a stock client gives itself is no metric to average
            if ask.config.get("phase") == "train" and not ask.evidence:
                self.round_averaged.add(ask.key)
                self.round_train_metrics.append((reply.key, reply.num_examples, {
                    k: v for k, v in reply.metrics.items() if k not in STOCK_KEY_METRICS}))
            replies.append(reply)
            self.accepted_train += 1
            self.round_accepted += 1
        if mismatches and not self.accepted_train:
            key, error = mismatches[0]
            raise ModelMismatchError(
                f"the clients' model does not match initial_arrays: client {key} (node "
                f"{self.members.node_of_key.get(key)}) replied {error} ({len(mismatches)} of {len(asks)} replies "
                f"differ so, none matched); give start() the arrays of the model the ClientApp trains")
        return replies

    def evaluate_plan(self, server_round: int, models: dict[str, tuple[int, Any]],
                      config: dict[str, Any]) -> dict[str, tuple[Any, dict[str, Any]]]:
        """What each evaluated client is sent: its model, ``config`` with the round, phase and its cluster."""
        return {key: (model, {**config, "server-round": server_round, "phase": "evaluate", "cluster-id": cluster})
                for key, (cluster, model) in models.items()}

    def evaluate(self, server_round: int, active: list[str]) -> list[EvalRow]:
        """Evaluate a sample of the placed clients among ``active`` (the keys the round was handed)."""
        models = self.strategy.evaluation_models(server_round, active)
        self.evaluate_sent = len(models)
        received, _ = self.link.send(server_round, self.evaluate_plan(server_round, models, self.evaluate_config),
                                     MessageType.EVALUATE)
        metric = self.recorder.metric.name if self.recorder is not None else "accuracy"
        rows, averaged = eval_rows(server_round, received, models, self.members.clients, metric, self.link.reject)
        self.round_eval_metrics.extend(averaged)
        return rows

    # ------------------------------------------------------------ checkpoints
    def checkpoint_state(self, server_round: int) -> dict[str, Any]:
        members = self.members
        return {
            "round": server_round,
            "config": self.options.run_config,
            "model_shapes": {k: (list(s), str(d)) for k, (s, d) in self.shapes.items()},
            "algorithm": self.strategy.get_state(),
            "clients": members.clients,
            "stock": sorted(members.stock),
            "held_back": sorted(self.newcomers.held_back),
            "absent": sorted(members.absent),
            "misses": dict(members.misses),
            "nodes": dict(members.node_of_key),
            "recorder": self.recorder.state() if self.recorder is not None else None,
        }

    def resume(self, directory: str) -> int:
        """Restore the state saved after a round (loaded and checked here unless the app's
        preflight did); returns that round."""
        state = self.options.resume_state
        if state is None:
            state = load_checkpoint(directory)
            check_compatible(state, self.options.run_config,
                             {k: (list(s), str(d)) for k, (s, d) in self.shapes.items()})
        self.strategy.set_state(state["algorithm"])
        members = self.members
        members.clients.clear()
        members.clients.update(state["clients"])
        members.stock = set(state.get("stock", ()))
        self.newcomers.held_back = set(state["held_back"])
        members.absent = set(state.get("absent", ()))
        members.misses = dict(state.get("misses", {}))
        members.last_key_of_node.clear()  # shared with the link: filled in place
        members.last_key_of_node.update({node: key for key, node in state.get("nodes", {}).items()})
        if self.recorder is not None and state.get("recorder") is not None:
            self.recorder.restore(state["recorder"])
        log(logging.INFO, "resumed from %s after round %s", directory, state["round"])
        return int(state["round"])
