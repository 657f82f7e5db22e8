"""What the round driver and a clustered strategy know of each other, in a module both may
import: ``strategies/`` never imports ``runner/``.

What the driver reads and calls on a strategy (``DRIVER_CALLS``; every public strategy has
each, a test checks): ``name``, ``params`` (its validated Params: seed, fraction and node
counts), ``assignment`` (client key -> cluster), ``theta0``, ``shapes``,
``stock_alternative``; ``requires()``, ``check_train_config(config)``, ``init(theta0)``,
``round_steps(server_round, active, train_config, clients, one_exchange=False)`` (the round's generator over the
active clients, reading the membership's client table, all held by the round's ``Round``,
which every hook gets as its first argument: it yields lists of asks, is sent their validated
replies and returns a ``RoundResult``, its diagnostics and its reports — the splits and
placements the driver scores),
``evaluation_models(server_round, active)`` (``active``: the keys the round was handed),
``cluster_models()``, ``final_clusters(training_failed, clients)``, ``get_state()`` /
``set_state(state)``, ``one_cluster_reason(clients)``, ``one_cluster_advice()``,
``cluster_count_basis()``. Whatever the driver hands the strategy travels as arguments, never
as writes into the strategy's fields; nothing of a round (active clients, train config, client
table, sample, reports) is kept on the strategy.

What a strategy's Flower methods (``start`` and the single-phase hooks) call is the runner
(``clusterfed.runner.strategy_runner``: ``new_driver``, ``driver_on``, ``start``,
``configure_train``, ``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate``). A
strategy reaches it through ``runner()``, which loads it by its import path ``RUNNER`` on first
use (``clusterfed.lazy``): importing a strategy loads no runner code, and the import graph stays
one way. This module imports nothing of clusterfed but ``clusterfed.lazy``.
"""

from __future__ import annotations

from types import ModuleType
from clusterfed import lazy

RUNNER = "clusterfed.runner.strategy_runner"

DRIVER_CALLS = frozenset({
    "name", "params", "assignment", "theta0", "shapes", "stock_alternative",
    "requires", "check_train_config", "init", "round_steps", "evaluation_models", "cluster_models",
    "final_clusters", "get_state", "set_state", "one_cluster_reason", "one_cluster_advice", "cluster_count_basis",
})


def runner() -> ModuleType:
    """The runner behind a strategy's ``start`` and single-phase hooks, loaded on first use."""
    return lazy.load(RUNNER)
