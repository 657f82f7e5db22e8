"""Strategy parameters in a run config: ``<strategy>.<param>`` keys, the way Flower flattens
a TOML table (``[tool.flwr.app.config.fedclust] lambda = "auto"`` → ``fedclust.lambda``).

Each strategy's ``Params`` (a pydantic model in its own module) is the only declaration;
this module reads those schemas to sort a flat run config into run keys and the chosen
strategy's parameters, and to map today's flat keys (``distance``, ``hicfl-timing``) to
the new ones with a warning.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable
from typing import Any

from flwr.supercore import log
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from clusterfed.strategies import UnknownStrategyError, clustered_classes, strategy_class
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.core.params import SHARED_PARAMS, StrategyParams, group_errors, settings_errors


class ConfigError(ValueError):
    """A run-config key or value is wrong; the message names it and what is allowed."""


_SAID: set[str] = set()  # each warning once per process


def _warn(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log(logging.WARNING, "%s", message)


def key_of(name: str, field: FieldInfo) -> str:
    return field.alias or name


def paper_keys(cls: type[ClusteredStrategy]) -> dict[str, Any]:
    """The strategy's paper preset (``PAPER``, by field name) by run-config key (``preset = "paper"``);
    ConfigError for a strategy with no paper preset."""
    if cls.PAPER is None:
        raise ConfigError(f'preset = "paper": strategy {cls.name!r} has no paper preset')
    fields = cls.Params.model_fields
    return {key_of(name, fields[name]): value for name, value in cls.PAPER.items()}


def legacy_key(name: str, field: FieldInfo) -> str:
    """The flat run-config key this parameter had before namespacing."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("legacy", key_of(name, field)))


def own_params(cls: type) -> dict[str, FieldInfo]:
    """The strategy's own parameters (kebab key -> field), without Flower's shared ones."""
    return {key_of(n, f): f for n, f in cls.Params.model_fields.items() if n not in SHARED_PARAMS}


def default_of(field: FieldInfo) -> Any:
    return field.get_default(call_default_factory=True)


def split_strategy_params(values: dict[str, Any], *, run_keys: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run keys and values, the chosen strategy's parameters as given, by kebab key): sorts
    the keys and names every unknown one; the chosen strategy's values are validated once,
    later, by its ``Params`` (``validate_params``). Other strategies' tables are checked for
    typos and ignored."""
    name = values.get("strategy", "fedavg")
    try:
        cls = strategy_class(str(name))
    except UnknownStrategyError as error:
        raise ConfigError(f"config key 'strategy': {error}") from None
    clustered = issubclass(cls, ClusteredStrategy)
    chosen = cls.name if clustered else None
    classes = dict(clustered_classes())
    if clustered:
        classes.setdefault(chosen, cls)
    own = {ns: own_params(c) for ns, c in classes.items()}
    legacy: dict[str, list[tuple[str, str]]] = {}
    for ns, c in classes.items():
        for n, f in c.Params.model_fields.items():
            if n not in SHARED_PARAMS:
                legacy.setdefault(legacy_key(n, f), []).append((ns, key_of(n, f)))
    run_values: dict[str, Any] = {}
    params: dict[str, Any] = {}
    from_legacy: dict[str, Any] = {}
    others: dict[str, dict[str, Any]] = {}  # other strategies' keys: checked, then ignored
    for key, value in values.items():
        if key in run_keys:
            run_values[key] = value
        elif "." in key:
            ns, _, param = key.partition(".")
            if ns not in own:
                close = difflib.get_close_matches(ns, list(own), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"config key {key!r}: no strategy is named {ns!r}{hint}; strategies: {', '.join(own)}")
            if param not in own[ns]:
                having = [s for s, keys in own.items() if param in keys]
                where = f"; {', '.join(having)} {'has' if len(having) == 1 else 'have'} it" if having else ""
                raise ConfigError(f"config key {key!r}: strategy {ns!r} has no parameter {param!r}{where}; "
                                  f"its parameters: {', '.join(own[ns]) or 'none'}")
            if ns == chosen:
                params[param] = value
            else:
                others.setdefault(ns, {})[param] = value
                if value != default_of(own[ns][param]):
                    _warn(f"config key {key!r} is ignored: the strategy is {name!r}")
        elif key in legacy:
            mine = [param for ns, param in legacy[key] if ns == chosen]
            if mine:
                from_legacy[mine[0]] = value
                _warn(f"config key {key!r} is deprecated: use {chosen}.{mine[0]}")
            else:
                ns, param = legacy[key][0]
                if value != default_of(own[ns][param]):
                    having = sorted({s for s, _ in legacy[key]})
                    _warn(f"config key {key!r} is ignored: strategy {name!r} does not read it "
                          f"(a parameter of {', '.join(having)})")
        else:
            known = run_keys + [f"{ns}.{p}" for ns, keys in own.items() for p in keys]
            close = difflib.get_close_matches(key, known + list(legacy), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}; run keys: {', '.join(run_keys)}; "
                              f"strategy parameters are '<strategy>.<param>' (see 'clusterfed params')")
    for ns, given in others.items():  # a typo in another strategy's table is still a typo
        try:
            classes[ns].Params.model_validate(given)
        except ValidationError as error:
            raise ConfigError(problems(error, classes[ns], lambda key: f"{ns}.{key}")) from None
    if not clustered:
        return run_values, {}
    return run_values, {**from_legacy, **params}


def validate_params(cls: type[ClusteredStrategy], shared: dict[str, Any], given: dict[str, Any]) -> StrategyParams:
    """The strategy's ``Params`` from the run's shared keys (``fraction-train``, ``seed``, …)
    and its own ``<strategy>.<param>`` values: the one validation of a strategy's parameters
    in a run (the strategy is built from this object, ``ClusteredStrategy.from_params``).
    ConfigError names each wrong key as the run config spells it."""
    try:
        params = cls.Params.model_validate({**shared, **given})
    except ValidationError as error:
        raise ConfigError(problems(error, cls, lambda key: key if key in shared else f"{cls.name}.{key}")) from None
    refusal = getattr(cls, "secure_refusal", None)
    if params.secagg is not None and refusal:  # before round 1, before any message
        raise ConfigError(f"config key 'secure-aggregation' = {params.secure_aggregation!r}: {cls.name} refuses it: "
                          f"{refusal}")
    return params


def own_values(params: StrategyParams) -> dict[str, Any]:
    """A strategy's own parameters by kebab key (without the shared ones), as a run config holds them."""
    dumped = params.model_dump(by_alias=True)
    return {key_of(n, f): dumped[key_of(n, f)] for n, f in type(params).model_fields.items() if n not in SHARED_PARAMS}


def problems(error: ValidationError, cls: type, shown: Callable[[str], str]) -> str:
    """One clause per wrong key of strategy ``cls``'s ``Params``, named as the run config spells
    it (``shown``); a ``number | "auto"`` key's two complaints joined by "or". A check of keys
    together (the dp-* settings) says the strategy's sentence with the run config's keys."""
    clauses = [f"config key {shown(key)!r} = {given!r}: {' or '.join(msgs)}"
               for key, (given, msgs, _) in group_errors(error).items()]
    for sentence in settings_errors(error):
        for name, field in cls.Params.model_fields.items():
            sentence = re.sub(rf"\b{name}\b", shown(key_of(name, field)), sentence)
        clauses.append(f"{cls.name}: {sentence.replace('dp_*', 'dp-*')}")
    return "; ".join(clauses)


def reference_rows(cls: type) -> list[tuple[str, Any, str, str]]:
    """(key, default, type, description) of each of a strategy's own parameters."""
    rows = []
    for n, f in cls.Params.model_fields.items():
        if n in SHARED_PARAMS:
            continue
        rows.append((key_of(n, f), default_of(f), _type_name(f), f.description or ""))
    return rows


def _type_name(field: FieldInfo) -> str:
    text = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    return text.replace("Annotated[float, FieldInfo(annotation=NoneType, required=True, metadata=[Gt(gt=0)])]",
                        "float > 0")
