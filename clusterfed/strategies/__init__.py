"""The strategies: one module per algorithm, the registry (``registry.py``, re-exported here:
run-config name -> the class that implements it) and the kit a strategy is written with.

Adding a strategy to clusterfed is its module in this package, its test and one line in
``REGISTRY`` (``registry.py``): the public name (``clusterfed.<Class>``, ``__all__``, ``dir(clusterfed)``), the
type stub, the configuration reference (``python -m clusterfed.reference --write``) and the
partial-participation smoke run all follow from that line and the class.

A strategy defined outside clusterfed runs by ``strategy = "package.module:Class"`` in a
run config, or by name once its package declares an entry point in the
``clusterfed.strategies`` group (``[project.entry-points."clusterfed.strategies"]
mystrategy = "package.module:Class"``). Either must subclass ``ClusteredStrategy``.

What a strategy module needs is importable from here (``from clusterfed.strategies import
ClusteredStrategy, Steps, steps, select_layers, upload_names``), loaded on first use; see
``AUTHOR_KIT`` and docs/library.md, "Writing a strategy".
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from clusterfed.strategies.registry import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    UnknownStrategyError,
    clustered_classes,
    public_strategies,
    strategy_class,
    strategy_names,
)

# what a strategy module is written with: name -> the module that defines it
AUTHOR_KIT = {
    # the base and its declarations
    "ClusteredStrategy": "clusterfed.strategies.base",
    "StrategyParams": "clusterfed.strategies.base",
    "ClusteredState": "clusterfed.strategies.base",
    "StrategyParamsError": "clusterfed.strategies.base",
    "MULTI_MODEL": "clusterfed.strategies.base",
    "LABEL_STATS": "clusterfed.strategies.base",
    # hooks that ask clients for work
    "Steps": "clusterfed.strategies.base",
    "steps": "clusterfed.strategies.base",
    "Ask": "clusterfed.strategies.exchange",
    "Replies": "clusterfed.strategies.exchange",
    "TrainReply": "clusterfed.strategies.exchange",
    "ClientInfo": "clusterfed.strategies.exchange",
    "Arrays": "clusterfed.strategies.exchange",
    "weighted_average": "clusterfed.strategies.exchange",
    "natural": "clusterfed.strategies.exchange",
    # partial upload: which arrays, asked how, stacked how
    "select_layers": "clusterfed.models.layers",
    "LAYER_RULES": "clusterfed.models.layers",
    "compared_names": "clusterfed.models.parameters",
    "upload_names": "clusterfed.protocol",
    "parse_upload": "clusterfed.protocol",
    "UPLOAD_FULL": "clusterfed.protocol",
    "RETURN_WEIGHTS": "clusterfed.protocol",
    "RETURN_UPDATE": "clusterfed.protocol",
    "stack_partials": "clusterfed.clustering.distances",
}

if TYPE_CHECKING:  # what IDEs and type checkers read; at run time each is imported on first use
    from clusterfed.clustering.distances import stack_partials
    from clusterfed.models.layers import LAYER_RULES, select_layers
    from clusterfed.models.parameters import compared_names
    from clusterfed.protocol import RETURN_UPDATE, RETURN_WEIGHTS, UPLOAD_FULL, parse_upload, upload_names
    from clusterfed.strategies.base import (
        LABEL_STATS,
        MULTI_MODEL,
        ClusteredState,
        ClusteredStrategy,
        Steps,
        StrategyParams,
        StrategyParamsError,
        steps,
    )
    from clusterfed.strategies.exchange import Arrays, Ask, ClientInfo, Replies, TrainReply, natural, weighted_average


def __getattr__(name: str):
    if name in AUTHOR_KIT:
        return getattr(import_module(AUTHOR_KIT[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AUTHOR_KIT", "ENTRY_POINT_GROUP", "REGISTRY", "UnknownStrategyError", "clustered_classes",
           "public_strategies", "strategy_class", "strategy_names", *AUTHOR_KIT]
