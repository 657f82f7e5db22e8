"""Flower's own ``FedAvg``, unchanged in its algorithm, with our measurement around it.

The reference we measure the clustered base's overhead against: same clients, same
data, Flower's sampling and aggregation code.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.config import RunConfig
from clusterfed.results import EvalRow, RunRecorder, Traffic


# Flower 1.43's ``Strategy.start`` asks ``should_stop(round, result)`` after each round itself
FLOWER_STOPS = "should_stop" in inspect.signature(FedAvg.start).parameters


class _Stopped(Exception):
    """Ends Flower 1.41/1.42's loop after a round whose ``should_stop`` said so."""


class FlowerFedAvg(FedAvg):
    name = "flwr-fedavg"

    def __init__(self, config: RunConfig, recorder: RunRecorder | None = None):
        super().__init__(
            fraction_train=config.fraction_train,
            fraction_evaluate=config.fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=config.num_clients,
            arrayrecord_key=protocol.ARRAYS,
            configrecord_key=protocol.CONFIG,
        )
        self.config = config
        self.recorder = recorder
        self.traffic = Traffic()
        self.round_started = 0.0
        self.true_groups: dict[str, int] = {}
        self.progress = Result()  # the Result so far, as Flower's loop fills its own (for should_stop)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None, should_stop: Callable[[int, Result], bool] | None = None) -> Result:
        """Flower's ``start`` with the run's configs; ``should_stop(round, result)`` ends the run
        after a round (Flower 1.43 asks it itself; on 1.41/1.42 it is asked where Flower's
        loop ends each round, its server-side evaluation)."""
        random.seed(self.config.seed)  # Flower samples nodes with the global `random`
        values = protocol.client_spec(self.config.to_flower())
        values.update({"local-epochs": self.config.local_epochs, "lr": self.config.lr, "cluster-id": 0,
                       "upload": protocol.UPLOAD_FULL, "return": protocol.RETURN_WEIGHTS})
        run = {"num_rounds": num_rounds, "timeout": timeout, "train_config": ConfigRecord(values),
               "evaluate_config": ConfigRecord(values)}
        if should_stop is None:
            return super().start(grid, initial_arrays, **run, evaluate_fn=evaluate_fn)
        if FLOWER_STOPS:
            return super().start(grid, initial_arrays, **run, evaluate_fn=evaluate_fn, should_stop=should_stop)
        self.progress = Result(arrays=initial_arrays)

        def evaluate_then_ask(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            metrics = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if metrics is not None:
                self.progress.evaluate_metrics_serverapp[server_round] = metrics
            if server_round > 0 and should_stop(server_round, self.progress):  # as 1.43: not round 0
                raise _Stopped(server_round)
            return metrics

        try:
            return super().start(grid, initial_arrays, **run, evaluate_fn=evaluate_then_ask)
        except _Stopped as stop:
            log(logging.INFO, "[ROUND %s/%s] should_stop returned True: the run stops here", stop.args[0], num_rounds)
            return self.progress

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self.round_started = time.perf_counter()
        self.traffic = Traffic()
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.traffic.down += sum(protocol.message_array_bytes(m.content) for m in messages)
        self.sent_train = len(messages)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        ok = [r for r in replies if not r.has_error()]
        self.traffic.up += sum(protocol.message_array_bytes(r.content) for r in ok)
        self.traffic.transmissions += len(ok)
        self.traffic.failures += self.sent_train - len(ok)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:
            self.progress.arrays = arrays
        if metrics is not None:
            self.progress.train_metrics_clientapp[server_round] = metrics
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self.traffic.eval_down += sum(protocol.message_array_bytes(m.content) for m in messages)
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        rows = []
        for reply in replies:
            if reply.has_error():
                continue
            metrics, client = reply.content[protocol.METRICS], reply.content[protocol.CLIENT]
            key = str(client["client-key"])
            self.true_groups[key] = int(client["true-group"])
            rows.append(EvalRow(key, 0, int(client["true-group"]), float(metrics["eval-accuracy"]),
                                float(metrics["eval-loss"]), int(metrics["num-examples"])))
        if self.recorder is not None:
            self.recorder.record_round(
                server_round, evals=rows, assignment={k: 0 for k in self.true_groups}, true_groups=self.true_groups,
                traffic=self.traffic, round_seconds=time.perf_counter() - self.round_started,
            )
        metrics = super().aggregate_evaluate(server_round, replies)
        if metrics is not None:
            self.progress.evaluate_metrics_clientapp[server_round] = metrics
        return metrics

    def final_clusters(self, training_failed: str | None = None, clients: Any = None) -> dict[str, Any]:
        return {"strategy": self.name, "assignment": {k: 0 for k in self.true_groups}, "true_groups": self.true_groups,
                "sizes": {"0": len(self.true_groups)}, "newcomers": []}
