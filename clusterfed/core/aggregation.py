"""Flower's aggregation strategies inside each cluster.

Every clustered strategy takes ``aggregator``: the within-cluster aggregator, either a Flower
strategy instance (``FedClust(aggregator=FedAdam(eta=0.01))``) or its name with literal
keyword options (``"fedadam"``, ``"fedtrimmedavg(beta=0.2)"``: the run key ``aggregator``).
The instance is a template: each cluster aggregates with its own deep copy, so each cluster
has its own server-optimiser state (FedAdam's ``m_t``/``v_t``, FedAvgM's momentum). That
state is kept as plain data (arrays, numbers) in the strategy's checkpointed state, one
entry per cluster; a cluster's optimiser is rebuilt from the template and its entry for
each aggregation, so a resumed run continues bit for bit.

What a new cluster's optimiser starts from is the caller's choice (``ClusteredStrategy.
new_cluster(model, inherit=parent)``): the two children of a split start from their
parent's model and inherit a copy of its optimiser state; clusters formed by a cut or by a
merge start afresh.

Flower's code does the aggregating: the replies become Flower train replies
(``clusterfed.flower_replies``, outside ``strategies/`` and ``runner/``) and the cluster's
copy's ``aggregate_train`` is called, with the cluster's own step count as the round (FedAdam's
bias correction counts the cluster's own steps). Only floating-point arrays go through it;
counters and masks (integer and bool arrays) are averaged as without an aggregator, and
every result keeps its array's dtype and shape.

A robust aggregator needs enough replies in a cluster: Krum and MultiKrum at least 2f + 3
(Blanchard et al., n > 2f + 2), Bulyan at least 4f + 3, f being ``num_malicious_nodes``.
A cluster with fewer replies in a round is averaged by num-examples that round instead,
and ``fallback`` says why (the strategy records it in rounds.jsonl).
"""

from __future__ import annotations

import ast
import copy
import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp import strategy as flower

from clusterfed.flower_replies import train_reply
from clusterfed.core.exchange import Arrays, weighted_average

DEFAULT = "fedavg"
# Flower strategies that are no within-cluster aggregator, and why
REFUSED = {
    "QFedAvg": "it reweights by each client's training loss before and after, which a reply does not carry",
    "FedXgbBagging": "it aggregates XGBoost trees (bytes), not arrays",
    "FedXgbCyclic": "it trains one client at a time (XGBoost), it does not aggregate",
}
# FedAvg's constructor arguments: node sampling and message keys, which clusterfed owns
SAMPLING_OPTIONS = tuple(p for p in inspect.signature(flower.FedAvg.__init__).parameters if p != "self")
STATE_KEY = "attributes"


class AggregatorError(ValueError):
    """An aggregator that cannot aggregate within clusters, or options it does not take."""


def flower_aggregators() -> dict[str, type]:
    """Flower's aggregation strategies by lower-case name (``fedadam`` → FedAdam)."""
    out = {}
    for name in flower.__all__:
        cls = getattr(flower, name)
        if isinstance(cls, type) and issubclass(cls, flower.FedAvg) and name not in REFUSED:
            out[name.lower()] = cls
    return out


def options_of(cls: type) -> list[str]:
    """The keyword options of a Flower strategy beyond FedAvg's sampling and message keys."""
    return [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", *SAMPLING_OPTIONS)]


def parse_spec(spec: str) -> flower.FedAvg:
    """``"fedadam"`` or ``"fedadam(eta=0.01, beta_1=0.9)"`` → the Flower strategy. Options
    are literal keyword values (read with ``ast.literal_eval``: nothing runs)."""
    text = spec.strip()
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise AggregatorError(f"{spec!r} is not a name or name(option=value, ...)") from None
    if isinstance(node, ast.Name):
        name, keywords = node.id, []
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        name, keywords = node.func.id, node.keywords
    else:
        raise AggregatorError(f"{spec!r} is not a name or name(option=value, ...) with keyword options")
    known = flower_aggregators()
    cls = known.get(name.lower())
    if cls is None:
        refused = {n.lower(): n for n in REFUSED}
        if name.lower() in refused:
            raise AggregatorError(f"Flower's {refused[name.lower()]} cannot aggregate within a cluster: "
                                  f"{REFUSED[refused[name.lower()]]}")
        raise AggregatorError(f"no Flower aggregation strategy is named {name!r}; known: {', '.join(known)}")
    options: dict[str, Any] = {}
    for keyword in keywords:
        if keyword.arg is None:
            raise AggregatorError(f"{spec!r}: write each option as name=value")
        try:
            options[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            raise AggregatorError(f"{spec!r}: option {keyword.arg} must be a literal value") from None
    allowed = options_of(cls)
    for option in options:
        if option in SAMPLING_OPTIONS:
            raise AggregatorError(f"{cls.__name__}: option {option!r} is clusterfed's to set (node sampling and "
                                  f"message keys belong to the clustered strategy); {cls.__name__}'s options: "
                                  f"{', '.join(allowed) or 'none'}")
        if option not in allowed:
            raise AggregatorError(f"{cls.__name__} has no option {option!r}; its options: {', '.join(allowed) or 'none'}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as error:
        raise AggregatorError(f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in options.items())}): {error}") from None


def check_aggregator(value: Any) -> Any:
    """The ``aggregator`` parameter, validated: a name/spec string or a Flower strategy
    instance that aggregates arrays (returned unchanged); AggregatorError (a ValueError)
    naming what is wrong."""
    if isinstance(value, str):
        template = parse_spec(value)
    elif isinstance(value, flower.Strategy):
        template = value
    else:
        raise AggregatorError(f"expected a Flower strategy (e.g. FedAdam(...)) or its name, got {type(value).__name__}")
    name = type(template).__name__
    if name in REFUSED and type(template).__module__.startswith("flwr."):
        raise AggregatorError(f"Flower's {name} cannot aggregate within a cluster: {REFUSED[name]}")
    if not isinstance(template, flower.FedAvg):
        raise AggregatorError(f"{name} is not a Flower aggregation strategy (a FedAvg subclass whose aggregate_train "
                              f"averages the replies' arrays); clustered strategies are not aggregators either")
    if hasattr(template, "current_arrays") and not isinstance(template, (flower.FedAvgM, _FedOpt)):
        raise AggregatorError(f"{name} keeps a current model (current_arrays) in a way clusterfed does not know: "
                              f"within a cluster it supports Flower's FedAvgM, FedAdam, FedYogi and FedAdagrad")
    malicious = getattr(template, "num_malicious_nodes", 0)
    if isinstance(malicious, bool) or not isinstance(malicious, int) or malicious < 0:
        raise AggregatorError(f"{name}: num_malicious_nodes = {malicious!r}: must be an integer >= 0")
    selected = getattr(template, "num_nodes_to_select", 1)
    if isinstance(template, flower.MultiKrum) and (not isinstance(selected, int) or selected < 1):
        raise AggregatorError(f"{name}: num_nodes_to_select = {selected!r}: must be an integer >= 1")
    return value


_FedOpt = flower.FedAdam.__mro__[1]  # Flower's FedOpt (not exported): FedAdam, FedYogi, FedAdagrad


def template_of(value: Any) -> flower.FedAvg | None:
    """The Flower strategy an ``aggregator`` parameter stands for; None for plain FedAvg
    (clusterfed's own sample-weighted mean, the same arithmetic kept in each array's dtype)."""
    template = parse_spec(value) if isinstance(value, str) else value
    return None if type(template) is flower.FedAvg else template


def min_replies(template: flower.FedAvg) -> int:
    """The fewest replies in a cluster the aggregator is defined for (module docstring)."""
    f = int(getattr(template, "num_malicious_nodes", 0))
    if isinstance(template, flower.Bulyan):
        return 4 * f + 3
    if isinstance(template, flower.MultiKrum):  # Krum is MultiKrum selecting one
        return max(2 * f + 3, int(template.num_nodes_to_select))
    return 1


class ClusterAggregator:
    """A Flower strategy as template, applied per cluster with that cluster's own state."""

    def __init__(self, template: flower.FedAvg) -> None:
        self.template = template
        self.name = type(template).__name__
        self.min_replies = min_replies(template)
        self._reference = copy.deepcopy(template)  # what a fresh copy holds: state is what differs

    def fresh_state(self) -> dict[str, Any]:
        """A new cluster's optimiser state: no steps, the template's attributes."""
        return {"aggregator": self.name, "steps": 0, STATE_KEY: {}}

    def aggregate(self, model: Arrays, weights: list[Arrays], counts: list[float],
                  state: dict[str, Any] | None) -> tuple[Arrays, dict[str, Any], str | None]:
        """(the cluster's new model, its new optimiser state, why the weighted mean was used
        instead or None) from the cluster's current ``model`` and its members' trained
        ``weights`` with their num-examples ``counts``."""
        state = self.fresh_state() if state is None else state
        if state.get("aggregator") != self.name:
            raise AggregatorError(f"this cluster's optimiser state was made by {state.get('aggregator')!r}, "
                                  f"the aggregator is {self.name!r}: resume with the aggregator the run started with")
        if len(weights) < self.min_replies:
            reason = (f"{self.name} needs at least {self.min_replies} replies in a cluster "
                      f"(num_malicious_nodes = {getattr(self.template, 'num_malicious_nodes', 0)}), got {len(weights)}: "
                      f"averaged by num-examples")
            return weighted_average(weights, counts), state, reason
        floats = [n for n in model if np.issubdtype(np.asarray(model[n]).dtype, np.floating)]
        others = [n for n in model if n not in floats]
        out = weighted_average([{n: w[n] for n in others} for w in weights], counts) if others else {}
        if floats:
            strategy = self.restore(state)
            step = int(state["steps"]) + 1
            set_current_model(strategy, {n: model[n] for n in floats})
            with _quiet_flower():
                record, _ = strategy.aggregate_train(step, [train_reply({n: w[n] for n in floats}, c)
                                                            for w, c in zip(weights, counts)])
            if record is None:  # Flower declined (e.g. Bulyan's own count check)
                reason = f"{self.name} returned no model: averaged by num-examples"
                return weighted_average(weights, counts), state, reason
            for n in floats:
                out[n] = np.asarray(record[n].numpy()).astype(np.asarray(model[n]).dtype, copy=False).reshape(
                    np.shape(model[n]))
            state = {"aggregator": self.name, "steps": step, STATE_KEY: self.attributes(strategy)}
        return {n: out[n] for n in model}, state, None

    def restore(self, state: dict[str, Any]) -> flower.FedAvg:
        """A copy of the template carrying the cluster's saved attributes."""
        strategy = copy.deepcopy(self.template)
        for name, value in state[STATE_KEY].items():
            setattr(strategy, name, _live(value))
        return strategy

    def attributes(self, strategy: flower.FedAvg) -> dict[str, Any]:
        """The attributes of ``strategy`` that aggregating changed (its optimiser state), as
        plain data; ``current_arrays`` is left out: it is the cluster's model, set again
        before each aggregation."""
        reference = vars(self._reference)
        out = {}
        for name, value in vars(strategy).items():
            if name == "current_arrays" or callable(value):
                continue
            plain = _plain(value)
            if plain is _SKIP:
                continue
            if not isinstance(plain, (np.ndarray, dict, list, tuple)) and name in reference \
                    and type(reference[name]) is type(value) and reference[name] == value:
                continue
            out[name] = plain
        return out


def set_current_model(strategy: flower.FedAvg, model: Arrays) -> None:
    """Tell a Flower server optimiser the model it steps from, where its ``configure_train``
    would have put it: FedOpt's family keeps a dict of arrays, FedAvgM an ArrayRecord."""
    if isinstance(strategy, _FedOpt):
        strategy.current_arrays = {n: np.asarray(v) for n, v in model.items()}
    elif isinstance(strategy, flower.FedAvgM):
        strategy.current_arrays = _record(model)


_SKIP = object()


def _plain(value: Any) -> Any:
    """An attribute value as checkpointable plain data; _SKIP for what is configuration
    objects rather than state (functions, loggers, ...)."""
    if value is None or isinstance(value, (bool, int, float, str, np.ndarray, np.generic)):
        return np.array(value, copy=True) if isinstance(value, np.ndarray) else value
    if isinstance(value, ArrayRecord):
        return ("ArrayRecord", {n: np.array(a.numpy(), copy=True) for n, a in value.items()})
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: _plain(v) for k, v in value.items()}
        return _SKIP if any(v is _SKIP for v in items.values()) else items
    if isinstance(value, list):
        items = [_plain(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    return _SKIP


def _live(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "ArrayRecord":
        return _record(value[1])
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if isinstance(value, dict):
        return {k: _live(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_live(v) for v in value]
    return value


def _record(arrays: Arrays) -> ArrayRecord:
    return ArrayRecord({n: Array(np.asarray(v)) for n, v in arrays.items()})


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


@contextmanager
def _quiet_flower() -> Iterator[None]:
    """Flower's per-call INFO lines ("aggregate_train: Received 5 results") once per cluster
    per round would drown the round line; warnings still show."""
    logger, quiet = logging.getLogger("flwr"), _BelowWarning()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
