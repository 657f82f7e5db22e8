"""Flower's single-phase hooks (``configure_train`` / ``aggregate_train`` /
``configure_evaluate``) for a clustered strategy driven by Flower's own ``Strategy.start``
loop or a user's: each placed trainer is sent its own cluster's model, and the replies are
averaged per cluster.

Those hooks have one exchange per round, so a step that asks clients for work before
training (placing clients by a clustering round, HiCFL's or CFL's descent of provisional
members, AdaCFL's clustering step) cannot run inside them: it stops the run with a
``StrategyParamsError`` naming ``strategy.start``, which runs such steps. Steps that ask
nothing run as in ``start``. A strategy that writes its own round (IFCA, ClientSelection)
has that round run: its first exchange is the hooks' one, and a round that asks for a
second (IFCA's restarts in round 1) stops the same way. A strategy that needs more than a
stock ClientApp refuses stock clients here as ``start`` does (``CapabilityError``). The
round's diagnostics (what its hooks returned) are logged at DEBUG level: Flower's loop keeps
no rounds.jsonl.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.runner.driver import RoundDriver
from clusterfed.runner.scoring import score_reports, weighted_metrics
from clusterfed.runner.validation import ReplyRejected, parse_train_reply
from clusterfed.strategies.contract import StrategyParamsError
from clusterfed.strategies.exchange import Diagnostics, TrainReply, diagnostics_of, natural, steps

if TYPE_CHECKING:
    from clusterfed.strategies.base import ClusteredStrategy


def driver_for(strategy: ClusteredStrategy, grid: Grid) -> RoundDriver:
    """The strategy's driver on ``grid`` (a new one for a new grid)."""
    if strategy.driver is None or strategy.driver.grid is not grid:
        if not strategy.theta0:  # init() not called
            raise StrategyParamsError("configure_train/configure_evaluate need an initialised strategy: "
                                      "call strategy.init(arrays) first, or use start()")
        driver = strategy.driver = RoundDriver(strategy, strategy.run_options)
        driver.link.grid = grid
        driver.members.probe_record = protocol.to_array_record(strategy.theta0)
    return strategy.driver


def run_without_asks(strategy: ClusteredStrategy, server_round: int, hook: str, result) -> Diagnostics:
    """Run a hook that may ask clients for work and return its diagnostics; stop loudly if it asks."""
    run = steps(result)
    try:
        asks = next(run)
    except StopIteration as done:
        return done.value
    run.close()
    raise StrategyParamsError(
        f"{strategy.name}: round {server_round}'s {hook} step asks {len(asks)} client(s) for work before "
        f"training (a clustering step), which Flower's single-phase configure_train/aggregate_train cannot "
        f"run; call strategy.start(grid=..., initial_arrays=..., num_rounds=...) instead")


def writes_own_round(strategy: ClusteredStrategy) -> bool:
    """Whether the strategy's ``round`` is its own (IFCA, ClientSelection) rather than the
    shared one, which defines ``finish_round`` beside it and whose steps run one by one here."""
    owner = next(cls for cls in type(strategy).__mro__ if "round" in vars(cls))
    return "finish_round" not in vars(owner)


def train_messages(strategy: ClusteredStrategy, server_round: int, config: dict, grid: Grid) -> list[Message]:
    """The train messages of ``Strategy.configure_train``: each placed trainer its cluster's
    model (a strategy with its own round: the first exchange of that round)."""
    driver = driver_for(strategy, grid)
    driver.new_round()
    driver.set_configs(config, driver.evaluate_config)
    driver.members.discover(server_round)
    driver.members.check_capabilities()
    started = time.perf_counter()
    strategy.reports = []
    strategy.active = driver.members.active_keys()
    driver.pending_round = None
    if writes_own_round(strategy):
        driver.pending_round = strategy.round(server_round)
        asks, driver.pending_diagnostics = next(driver.pending_round), {}
    else:
        strategy.sampled = strategy.draw_sample(server_round)
        unplaced = [k for k in strategy.active if k not in strategy.assignment]
        diagnostics = (run_without_asks(strategy, server_round, "placement", strategy.admit(server_round, unplaced))
                       if unplaced else {})
        diagnostics.update(run_without_asks(strategy, server_round, "before-train",
                                            strategy.before_train(server_round)))
        driver.pending_diagnostics = diagnostics
        asks = strategy.train_asks(server_round, strategy.select_trainers(server_round))
    driver.pending_asks = {ask.key: ask for ask in asks}
    driver.strategy_seconds += time.perf_counter() - started
    plan = {ask.key: (ask.model, {**config, **ask.config}) for ask in driver.pending_asks.values()}
    return driver.link.messages(server_round, plan, MessageType.TRAIN)[0]


def aggregate_train_messages(strategy: ClusteredStrategy, server_round: int,
                             replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """The replies to ``train_messages`` validated and folded in as ``start`` does; the
    largest cluster's model and the train metrics averaged by num-examples."""
    driver = strategy.driver
    if driver is None:
        raise StrategyParamsError("aggregate_train before configure_train: call configure_train first, or use start()")
    asks = driver.pending_asks
    good: list[TrainReply] = []
    answered = set()
    for message in replies:
        key = driver.members.key_of_node.get(message.metadata.src_node_id)
        if key not in asks:
            continue
        answered.add(key)
        if message.has_error():
            driver.link.fail(server_round, "error", message.error.reason, key, message.metadata.src_node_id)
            continue
        try:
            good.append(parse_train_reply(message.content, asks[key], driver.shapes or strategy.shapes,
                                          stock=key in driver.members.stock))
        except ReplyRejected as error:
            driver.link.reject(server_round, key, error)
    for key in sorted(set(asks) - answered, key=natural):  # Flower's loop hands over the replies it got in time
        driver.link.fail(server_round, "timeout", "no reply within the ServerApp loop's timeout", key,
                         driver.members.node_of_key.get(key))
    started, assignment_before = time.perf_counter(), dict(strategy.assignment)
    if driver.pending_round is None:
        diagnostics = {**driver.pending_diagnostics, **strategy.finish_round(server_round, good)}
    else:
        diagnostics = finish_own_round(strategy, server_round, driver.pending_round, good)
        driver.pending_round = None
    driver.strategy_seconds += time.perf_counter() - started
    score_reports(strategy.reports, driver.members.clients, assignment_before)
    log(logging.DEBUG, "round %s diagnostics: %s", server_round, diagnostics)
    return driver.largest_cluster_record(), weighted_metrics([(r.key, r.num_examples, r.metrics) for r in good])


def finish_own_round(strategy: ClusteredStrategy, server_round: int, round_steps, replies: list[TrainReply]) -> Diagnostics:
    """Hand the replies to the strategy's own round and return its diagnostics; stop loudly
    when the round asks for a second exchange (its state is left as the start of that one)."""
    try:
        more = round_steps.send(replies)
    except StopIteration as done:
        return diagnostics_of(done.value)
    round_steps.close()
    raise StrategyParamsError(
        f"{strategy.name}: round {server_round} asks {len(more)} client(s) for a second exchange after its first "
        f"(a round that tries several starts, say), which Flower's single-phase configure_train/aggregate_train "
        f"cannot run; call strategy.start(grid=..., initial_arrays=..., num_rounds=...) instead")


def evaluate_messages(strategy: ClusteredStrategy, server_round: int, config: dict, grid: Grid) -> list[Message]:
    """The evaluate messages of ``Strategy.configure_evaluate``: each sampled placed client its cluster's model."""
    driver = driver_for(strategy, grid)
    models = strategy.evaluation_models(server_round)
    plan = {key: (model, {**config, "server-round": server_round, "phase": "evaluate", "cluster-id": cluster})
            for key, (cluster, model) in models.items()}
    return driver.link.messages(server_round, plan, MessageType.EVALUATE)[0]
