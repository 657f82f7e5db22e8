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
ClusteredStrategy, Steps, steps, select_layers, upload_names``), loaded on first use
(``clusterfed.lazy``); see ``AUTHOR_KIT`` and docs/library.md, "Writing a strategy".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterfed import lazy
from clusterfed.strategies.registry import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    UnknownStrategyError,
    clustered_classes,
    public_strategies,
    strategy_class,
    strategy_names,
)

# what a strategy module is written with: name -> its import path (``clusterfed.lazy``)
AUTHOR_KIT = {
    # the base and its declarations
    "ClusteredStrategy": "clusterfed.strategies.base:ClusteredStrategy",
    "StrategyParams": "clusterfed.strategies.base:StrategyParams",
    "ClusteredState": "clusterfed.strategies.base:ClusteredState",
    "StrategyParamsError": "clusterfed.strategies.base:StrategyParamsError",
    "MULTI_MODEL": "clusterfed.strategies.base:MULTI_MODEL",
    "LABEL_STATS": "clusterfed.strategies.base:LABEL_STATS",
    # the round every hook gets (its number, active clients, train config, client table, sample)
    "Round": "clusterfed.core.exchange:Round",
    # hooks that ask clients for work
    "Steps": "clusterfed.strategies.base:Steps",
    "steps": "clusterfed.strategies.base:steps",
    "Ask": "clusterfed.core.exchange:Ask",
    "Replies": "clusterfed.core.exchange:Replies",
    "TrainReply": "clusterfed.core.exchange:TrainReply",
    "ClientInfo": "clusterfed.core.exchange:ClientInfo",
    "Arrays": "clusterfed.core.exchange:Arrays",
    "weighted_average": "clusterfed.core.exchange:weighted_average",
    "natural": "clusterfed.core.exchange:natural",
    # partial upload: which arrays, asked how, stacked how
    "select_layers": "clusterfed.models.layers:select_layers",
    "LAYER_RULES": "clusterfed.models.layers:LAYER_RULES",
    "compared_names": "clusterfed.models.parameters:compared_names",
    "upload_names": "clusterfed.protocol:upload_names",
    "parse_upload": "clusterfed.protocol:parse_upload",
    "UPLOAD_FULL": "clusterfed.protocol:UPLOAD_FULL",
    "RETURN_WEIGHTS": "clusterfed.protocol:RETURN_WEIGHTS",
    "RETURN_UPDATE": "clusterfed.protocol:RETURN_UPDATE",
    "stack_partials": "clusterfed.clustering.distances:stack_partials",
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
    from clusterfed.core.exchange import Arrays, Ask, ClientInfo, Replies, Round, TrainReply, natural, weighted_average


__getattr__ = lazy.attributes(__name__, AUTHOR_KIT)


__all__ = ["AUTHOR_KIT", "ENTRY_POINT_GROUP", "REGISTRY", "UnknownStrategyError", "clustered_classes",
           "public_strategies", "strategy_class", "strategy_names", *AUTHOR_KIT]
