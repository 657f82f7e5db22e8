"""A run's config passes each module once, top to bottom, and each option is validated once.

The flow is traced with ``sys.setprofile``: every entry into a clusterfed function one of whose
arguments is the run config (the ``RunConfig``, or its flat ``to_flower()`` form) is listed
with its module. A *stay* is a run of such entries in one module; a *return up* is a stay in
a module that is still on the call stack below (the config came back to a layer it had left
to go down again).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import clusterfed
from clusterfed.config import ConfigError, RunConfig, parse_config
from clusterfed.simulation import simulate
from clusterfed.strategies.base import StrategyParamsError
from clusterfed.strategies.fedclust import FedClust

PACKAGE = Path(clusterfed.__file__).parent


def carries_config(value) -> bool:
    return isinstance(value, RunConfig) or (isinstance(value, dict) and "num-clients" in value and "strategy" in value)


def trace_config(run) -> list[tuple[str, str, bool]]:
    """(module, function, whether the module is on the config's call stack already) of each
    stay of the config while ``run()`` runs."""
    entries: list[tuple[str, str, tuple[str, ...]]] = []
    stack: list[str | None] = []  # the module of each open call that carries the config, else None

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            module = None
            if code.co_filename.startswith(str(PACKAGE)):
                names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
                # the config's own methods are not a module it passes
                if any(name != "self" and carries_config(frame.f_locals.get(name)) for name in names):
                    module = Path(code.co_filename).relative_to(PACKAGE.parent).with_suffix("").as_posix()
                    entries.append((module, code.co_qualname, tuple(m for m in stack if m is not None)))
            stack.append(module)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    stays: list[tuple[str, str, bool]] = []
    for module, function, below in entries:
        if not stays or stays[-1][0] != module:
            stays.append((module, function, module in below))
    return stays


def tiny_run(out: Path) -> RunConfig:
    return parse_config({"strategy": "fedclust", "dataset": "digits", "num-clients": 4, "num-groups": 2,
                         "label-groups": "0,1,2,3,4;5,6,7,8,9", "rounds": 1, "out-dir": str(out),
                         "log-to": "none"})


def test_a_runs_config_passes_each_module_once(tmp_path):
    config = tiny_run(tmp_path)
    stays = trace_config(lambda: simulate(config, engine="inprocess", stream=None))
    per_module = Counter(module for module, _, _ in stays)
    returns = [module for module, _, up in stays if up]
    shown = "; ".join(f"{module}:{function}{' (return up)' if up else ''}" for module, function, up in stays)
    # before options were owned once: 10 stays in 7 modules, 3 returns up (preflight entered
    # twice); now the server app hands the checked config down once, after preflight
    assert per_module["clusterfed/simulation"] == per_module["clusterfed/runner/preflight"] == 1, shown
    assert all(count == 1 for module, count in per_module.items() if module != "clusterfed/server_app"), shown
    assert per_module["clusterfed/server_app"] <= 2 and returns in ([], ["clusterfed/server_app"]), shown
    assert len(stays) <= 8, shown
    assert (tmp_path / "summary.json").is_file()


def test_strategy_params_are_validated_once_and_the_strategy_built_from_them(monkeypatch):
    calls = []
    validate = FedClust.Params.model_validate.__func__

    def counting(cls, value, *args, **kwargs):
        if not isinstance(value, cls):  # an instance is returned as it is (pydantic validates it no more)
            calls.append(value)
        return validate(cls, value, *args, **kwargs)

    monkeypatch.setattr(FedClust.Params, "model_validate", classmethod(counting))
    config = parse_config({"strategy": "fedclust", "fedclust.lambda": 0.7, "seed": 3})
    strategy = config.build_strategy()
    assert len(calls) == 1
    assert strategy.params is config.params and strategy.params.lambda_ == 0.7 and strategy.params.seed == 3
    assert config.to_flower()["fedclust.lambda"] == 0.7


def test_a_bad_strategy_parameter_is_named_with_its_key_before_any_work():
    with pytest.raises(ConfigError) as error:
        parse_config({"strategy": "fedclust", "fedclust.lambda": "big"})
    assert "'fedclust.lambda' = 'big'" in str(error.value) and "'auto'" in str(error.value)
    with pytest.raises(ConfigError) as error:  # a shared key is named as the run config spells it
        parse_config({"strategy": "fedclust", "compare-arrays": "("})
    assert "'compare-arrays'" in str(error.value) and "regular expression" in str(error.value)


def test_a_strategy_takes_validated_params_as_they_are_and_only_its_own():
    params = parse_config({"strategy": "fedclust", "fedclust.lambda": 0.7}).params
    assert FedClust(params).params is params
    assert FedClust(params, seed=5).params.seed == 5 and FedClust(params, seed=5).params.lambda_ == 0.7
    with pytest.raises(StrategyParamsError, match="fedclust"):
        FedClust(parse_config({"strategy": "cfl"}).params)
