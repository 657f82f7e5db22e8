"""What the round driver and a clustered strategy know of each other, in a module both may
import: ``strategies/`` never imports ``runner/``, and the runner is typed against
``RoundStrategy`` rather than the strategies' base class.

- ``RoundStrategy``: what the driver calls on a strategy (its round, its evaluation models,
  its state, its final clusters). Whatever the driver hands the strategy travels as
  arguments (the round's active clients and train config, why nothing trained), never as
  writes into the strategy's fields.
- ``StrategyRunner``: what a strategy's Flower methods (``start`` and the single-phase
  hooks, Flower's API, so they stay on the strategy) call; the strategy keeps the driver
  the runner builds for it (its ``driver``). A strategy reaches the runner through
  ``runner()``, which loads it on first use with the loader the package root installed
  (``clusterfed/__init__``, the one module that may know both sides): importing a strategy
  loads no runner code, and the import graph stays one way.

This module imports nothing of clusterfed at run time, so the package root installs the
loader at no cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # flwr's record types and the strategies' plain exchange types, for annotations only
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Result

    from clusterfed.strategies.exchange import Arrays, ClientInfo, Steps


class RoundStrategy(Protocol):
    """A strategy as the round driver sees it."""

    name: str
    params: Any  # its validated Params (seed, fraction and node counts)
    clients: dict[str, ClientInfo]  # what the driver learnt of each client (profiles), shared with it
    assignment: dict[str, int]  # client key -> cluster
    reports: list[Any]  # this round's splits and placements, which the driver scores
    theta0: Arrays
    shapes: dict[str, tuple[tuple[int, ...], Any]]
    stock_alternative: str | None

    def requires(self) -> set[str]: ...

    def check_train_config(self, train_config: dict[str, Any]) -> None: ...

    def init(self, theta0: Arrays) -> None: ...

    def round_steps(self, server_round: int, active: list[str], train_config: dict[str, Any]) -> Steps:
        """The round's generator over ``active`` clients with ``train_config``: it yields
        lists of asks and is sent their validated replies; returns its diagnostics."""

    def evaluation_models(self, server_round: int) -> dict[str, tuple[int, Arrays]]: ...

    def cluster_models(self) -> dict[int, Arrays]: ...

    def final_clusters(self, training_failed: str | None = None) -> dict[str, Any]: ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def one_cluster_reason(self) -> str | None: ...

    def one_cluster_advice(self) -> str | None: ...

    def cluster_count_basis(self) -> str | None: ...


class StrategyRunner(Protocol):
    """What a strategy's Flower methods run (``clusterfed.runner.strategy_runner``). The
    runner builds a driver for a strategy (``new_driver``; ``driver_on`` for the single-phase
    hooks, which keep one per grid); the strategy keeps it and hands it back."""

    def new_driver(self, strategy: RoundStrategy, options: Any = None) -> Any: ...

    def driver_on(self, strategy: RoundStrategy, grid: Grid, current: Any, options: Any = None) -> Any: ...

    def start(self, driver: Any, grid: Grid, initial_arrays: ArrayRecord, *, num_rounds: int, timeout: float,
              train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
              should_stop: Callable[[int, Result], bool] | None) -> Result: ...

    def configure_train(self, driver: Any, server_round: int, config: dict[str, Any]) -> list[Message]: ...

    def aggregate_train(self, driver: Any, server_round: int,
                        replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]: ...

    def configure_evaluate(self, driver: Any, server_round: int, config: dict[str, Any]) -> list[Message]: ...

    def aggregate_evaluate(self, replies: Iterable[Message]) -> MetricRecord | None: ...


_runner: StrategyRunner | None = None
_load_runner: Callable[[], StrategyRunner] | None = None


def install_runner(load: Callable[[], StrategyRunner]) -> None:
    """How ``runner()`` loads the runner on first use (the package root calls this once)."""
    global _load_runner, _runner
    _load_runner, _runner = load, None


def runner() -> StrategyRunner:
    """The runner behind a strategy's ``start`` and single-phase hooks, loaded on first use."""
    global _runner
    if _runner is None:
        if _load_runner is None:  # only when this module is used without the clusterfed package
            raise RuntimeError("no strategy runner installed: import clusterfed (its __init__ installs it)")
        _runner = _load_runner()
    return _runner
