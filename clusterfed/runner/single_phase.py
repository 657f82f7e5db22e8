"""Flower's single-phase hooks (``configure_train`` / ``aggregate_train`` /
``configure_evaluate``) for a clustered strategy driven by Flower's own ``Strategy.start``
loop or a user's: each placed trainer is sent its own cluster's model, and the replies are
averaged per cluster.

Those hooks have one exchange per round, so a step that asks clients for work before
training (placing clients by a clustering round, HiCFL's or CFL's descent of provisional
members, AdaCFL's clustering step) cannot run inside them: it stops the run with a
``StrategyParamsError`` naming ``strategy.start``, which runs such steps. Steps that ask
nothing run as in ``start``. The round's diagnostics (what its hooks returned) are logged
at DEBUG level: Flower's loop keeps no rounds.jsonl.
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
from clusterfed.strategies.exchange import Diagnostics, TrainReply, steps

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


def train_messages(strategy: ClusteredStrategy, server_round: int, config: dict, grid: Grid) -> list[Message]:
    """The train messages of ``Strategy.configure_train``: each placed trainer its cluster's model."""
    driver = driver_for(strategy, grid)
    driver.new_round()
    driver.set_configs(config, driver.evaluate_config)
    driver.members.discover(server_round)
    started = time.perf_counter()
    strategy.reports = []
    strategy.active = driver.members.active_keys()
    strategy.sampled = strategy.draw_sample(server_round)
    unplaced = [k for k in strategy.active if k not in strategy.assignment]
    diagnostics = (run_without_asks(strategy, server_round, "placement", strategy.admit(server_round, unplaced))
                   if unplaced else {})
    diagnostics.update(run_without_asks(strategy, server_round, "before-train", strategy.before_train(server_round)))
    driver.pending_diagnostics = diagnostics
    driver.pending_asks = {ask.key: ask for ask in strategy.train_asks(server_round, strategy.select_trainers(server_round))}
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
    for message in replies:
        key = driver.members.key_of_node.get(message.metadata.src_node_id)
        if key not in asks or message.has_error():
            continue
        try:
            good.append(parse_train_reply(message.content, asks[key], driver.shapes or strategy.shapes,
                                          stock=key in driver.members.stock))
        except ReplyRejected as error:
            driver.link.reject(server_round, key, error)
    started, assignment_before = time.perf_counter(), dict(strategy.assignment)
    diagnostics = {**driver.pending_diagnostics, **strategy.finish_round(server_round, good)}
    driver.strategy_seconds += time.perf_counter() - started
    score_reports(strategy.reports, driver.members.clients, assignment_before)
    log(logging.DEBUG, "round %s diagnostics: %s", server_round, diagnostics)
    return driver.largest_cluster_record(), weighted_metrics([(r.key, r.num_examples, r.metrics) for r in good])


def evaluate_messages(strategy: ClusteredStrategy, server_round: int, config: dict, grid: Grid) -> list[Message]:
    """The evaluate messages of ``Strategy.configure_evaluate``: each sampled placed client its cluster's model."""
    driver = driver_for(strategy, grid)
    models = strategy.evaluation_models(server_round)
    plan = {key: (model, {**config, "server-round": server_round, "phase": "evaluate", "cluster-id": cluster})
            for key, (cluster, model) in models.items()}
    return driver.link.messages(server_round, plan, MessageType.EVALUATE)[0]
