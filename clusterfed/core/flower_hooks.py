"""The Flower face of a clustered strategy: Flower's ``Strategy.start`` and single-phase hooks,
each handed to the runner (``clusterfed.strategy_protocol.runner()``: reached without
importing ``clusterfed.runner``), whose round driver alone speaks Flower; the strategy's own
logic never sees a Message or the Grid."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from clusterfed import privacy
from clusterfed.core.contract import ClusteredResult, StrategyParamsError
from clusterfed.strategy_protocol import runner


class FlowerHooks(Strategy):
    """Flower's ``Strategy`` methods of ``ClusteredStrategy``."""

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None, should_stop: Callable[[int, Result], bool] | None = None) -> ClusteredResult:
        """Flower's ``Strategy.start``: run ``num_rounds`` rounds on ``grid`` from
        ``initial_arrays``. ``train_config`` / ``evaluate_config`` go to every client in every
        train / evaluate message (as with Flower's FedAvg); ``evaluate_fn(round, arrays)``,
        if given, is called on ``initial_arrays`` at round 0 and on the largest cluster's
        model after every round, as Flower's FedAvg calls it on the global model; its
        MetricRecord is stored per round in ``evaluate_metrics_serverapp``.
        ``should_stop(round, result)``, if given, is called after every round (the last too,
        as Flower's own loop calls it) with the Result so far (Flower 1.43's early stop): True ends the run there, and the
        Result is returned as after the last round. Returns Flower's Result with the clustering."""
        self.driver = runner().new_driver(self, self.run_options)
        return runner().start(self.driver, grid, initial_arrays, num_rounds=num_rounds, timeout=timeout,
                              train_config=train_config, evaluate_config=evaluate_config, evaluate_fn=evaluate_fn,
                              should_stop=should_stop)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Flower's single-phase hook: the strategy's round starts, and its first exchange is
        sent: one message per trainer, each with its own cluster's model. A round that first
        asks clients for clustering work, or asks for a second exchange, stops the run with a
        StrategyParamsError naming ``start``, which runs such rounds. ``arrays`` is ignored:
        every cluster has its own model."""
        self.refuse_flower_dp_wrapper(sys._getframe(1))
        self.driver = runner().driver_on(self, grid, self.driver, self.run_options)
        return runner().configure_train(self.driver, server_round, dict(config))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate the replies to ``configure_train``'s messages and hand them back to the
        round, which averages per cluster; returns the largest cluster's model and the train
        metrics averaged by num-examples."""
        return runner().aggregate_train(self.driver, server_round, list(replies))

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """One evaluate message per sampled placed client, with its own cluster's model."""
        self.refuse_flower_dp_wrapper(sys._getframe(1))
        self.driver = runner().driver_on(self, grid, self.driver, self.run_options)
        return runner().configure_evaluate(self.driver, server_round, dict(config))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' evaluate metrics averaged by num-examples (as Flower's FedAvg)."""
        return runner().aggregate_evaluate(replies)

    def refuse_flower_dp_wrapper(self, caller: Any) -> None:
        """StrategyParamsError naming the ``dp_*`` parameters when Flower's DP wrapper calls
        this strategy's single-phase hooks (it would clip and noise one model, not each cluster's)."""
        wrapper = privacy.flower_dp_wrapper(caller)
        if wrapper is not None:
            raise StrategyParamsError(privacy.wrapper_refusal(wrapper, type(self).__name__))

    def summary(self) -> None:
        log(logging.INFO, "%s: %s", type(self).__name__,
            ", ".join(f"{k}={v!r}" for k, v in self.params.model_dump().items()))

