"""The runner behind a clustered strategy's Flower methods (loaded by
``clusterfed.strategy_protocol.runner()`` by its import path): ``start`` runs the rounds with a new
``RoundDriver``; Flower's single-phase hooks run the same round through Flower's loop
(``single_phase``). ``new_driver`` is the one place a driver is built; the strategy keeps
the driver it is handed and passes it back to each call."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from clusterfed import protocol
from clusterfed.runner import single_phase
from clusterfed.runner.driver import RoundDriver, RunOptions
from clusterfed.runner.scoring import average_metrics
from clusterfed.core.contract import ClusteredResult, StrategyParamsError
from clusterfed.strategies.base import ClusteredStrategy


def new_driver(strategy: ClusteredStrategy, options: RunOptions | None = None) -> RoundDriver:
    """A new driver for ``strategy`` with the application's ``options`` (none: a user's own ServerApp)."""
    return RoundDriver(strategy, options)


def driver_on(strategy: ClusteredStrategy, grid: Grid, current: RoundDriver | None,
              options: RunOptions | None = None) -> RoundDriver:
    """The driver of Flower's single-phase hooks on ``grid``: ``current`` while it drives that
    grid, else a new one (the strategy must be initialised: the hooks get no initial arrays)."""
    if current is not None and current.grid is grid:
        return current
    if not strategy.theta0:  # init() not called
        raise StrategyParamsError("configure_train/configure_evaluate need an initialised strategy: "
                                  "call strategy.init(arrays) first, or use start()")
    driver = new_driver(strategy, options)
    driver.link.grid = grid
    driver.shapes = dict(strategy.shapes)  # what replies are checked against (start's begin() sets it there)
    driver.members.probe_record = protocol.to_array_record(strategy.theta0)
    return driver


def start(driver: RoundDriver, grid: Grid, initial_arrays: ArrayRecord, *, num_rounds: int = 3,
          timeout: float = 3600, train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
          evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
          should_stop: Callable[[int, Result], bool] | None = None) -> ClusteredResult:
    """Flower's ``Strategy.start`` on ``driver`` (``RoundDriver.start``)."""
    return driver.start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout, train_config=train_config,
                        evaluate_config=evaluate_config, evaluate_fn=evaluate_fn, should_stop=should_stop)


def configure_train(driver: RoundDriver, server_round: int, config: dict[str, Any]) -> list[Message]:
    return single_phase.train_messages(driver, server_round, config)


def aggregate_train(driver: RoundDriver | None, server_round: int,
                    replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
    return single_phase.aggregate_train_messages(driver, server_round, replies)


def configure_evaluate(driver: RoundDriver, server_round: int, config: dict[str, Any]) -> list[Message]:
    return single_phase.evaluate_messages(driver, server_round, config)


def aggregate_evaluate(replies: Iterable[Message]) -> MetricRecord | None:
    """The clients' evaluate metrics averaged by num-examples (as Flower's FedAvg)."""
    return average_metrics([m.content["metrics"] for m in replies if m.has_content() and "metrics" in m.content])
