"""A run's config passes each module once, top to bottom, and each option is validated once.

The flow is traced with ``sys.setprofile``: every entry into a clusterfed function one of whose
arguments is the run config (the ``RunConfig``, or its flat ``to_flower()`` form) is listed
with its module. A *stay* is a run of such entries in one module; a *return up* is a stay in
a module that is still on the call stack below (the config came back to a layer it had left
to go down again). Traced: ``simulate``, ``server_app.run_server`` and an experiment's grid of
two runs.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import clusterfed
from clusterfed.config import ConfigError, RunConfig, parse_config
from clusterfed.runner.preflight import Checked
from clusterfed.simulation import simulate
from clusterfed.strategies.base import StrategyParamsError
from clusterfed.strategies.fedclust import FedClust

PACKAGE = Path(clusterfed.__file__).parent


def carries_config(value) -> bool:
    """The run config as a ``RunConfig``, inside ``preflight``'s ``Checked``, or flat."""
    return (isinstance(value, (RunConfig, Checked))
            or (isinstance(value, dict) and "num-clients" in value and "strategy" in value))


def run_label(value) -> str:
    """Which run a config is: its out-dir's parent (a grid's ``<label>/seed<s>``)."""
    config = value.config if isinstance(value, Checked) else value
    return Path(config.out_dir if isinstance(config, RunConfig) else config.get("out-dir", "")).parent.name


def config_entries(run) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(module, function, the modules on the config's call stack below, the run's label) of
    each entry into a clusterfed function given the config while ``run()`` runs."""
    entries: list[tuple[str, str, tuple[str, ...], str]] = []
    stack: list[str | None] = []  # the module of each open call that carries the config, else None

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            module = None
            if code.co_filename.startswith(str(PACKAGE)):
                names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
                # the config's own methods are not a module it passes
                given = [frame.f_locals.get(name) for name in names if name != "self"]
                configs = [value for value in given if carries_config(value)]
                if configs:
                    module = Path(code.co_filename).relative_to(PACKAGE.parent).with_suffix("").as_posix()
                    entries.append((module, code.co_qualname, tuple(m for m in stack if m is not None),
                                    run_label(configs[0])))
            stack.append(module)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entries


def stays_of(entries) -> list[tuple[str, str, bool]]:
    """(module, function, whether the module is on the config's call stack already) of each
    stay: a run of entries in one module."""
    stays: list[tuple[str, str, bool]] = []
    for module, function, below, _ in entries:
        if not stays or stays[-1][0] != module:
            stays.append((module, function, module in below))
    return stays


def trace_config(run) -> list[tuple[str, str, bool]]:
    """Each stay of the config while ``run()`` runs (``stays_of``)."""
    return stays_of(config_entries(run))


def tiny_run(out: Path) -> RunConfig:
    return parse_config({"strategy": "fedclust", "dataset": "digits", "num-clients": 4, "num-groups": 2,
                         "label-groups": "0,1,2,3,4;5,6,7,8,9", "rounds": 1, "out-dir": str(out),
                         "log-to": "none"})


def describe(stays: list[tuple[str, str, bool]]) -> str:
    return "; ".join(f"{module}:{function}{' (return up)' if up else ''}" for module, function, up in stays)


@pytest.mark.end_to_end
def test_a_runs_config_passes_each_module_once(tmp_path):
    config = tiny_run(tmp_path)
    stays = trace_config(lambda: simulate(config, engine="inprocess", stream=None))
    # before options were owned once: 26 stays in 15 modules, 8 returns up; then 8 stays in 7
    # modules, 1 return up (the server app took the config back after preflight); now the
    # server app reads the checked config once and hands each part what it takes
    assert [module for module, _, _ in stays][:3] == ["clusterfed/simulation", "clusterfed/server_app",
                                                      "clusterfed/runner/preflight"], describe(stays)
    assert all(count == 1 for count in Counter(module for module, _, _ in stays).values()), describe(stays)
    assert not [module for module, _, up in stays if up], describe(stays)
    assert (tmp_path / "summary.json").is_file()


@pytest.mark.end_to_end
def test_the_server_apps_own_entry_passes_each_module_once(tmp_path):
    """``run_server`` given a run config (as ``main`` under ``flwr run`` and the benchmarks call it)."""
    from flwr.supercore.task_identity import TaskIdentity

    from clusterfed.client_app import app as client_app
    from clusterfed.runner.inprocess import InProcessGrid
    from clusterfed.server_app import run_server

    config = tiny_run(tmp_path)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(client_app, config.num_clients, timeout=config.timeout)
    stays = trace_config(lambda: run_server(grid, config, stream=None, node_wait_seconds=0))
    # before: 21 stays in 13 modules, 6 returns up
    assert [module for module, _, _ in stays][:2] == ["clusterfed/server_app", "clusterfed/runner/preflight"]
    assert all(count == 1 for count in Counter(module for module, _, _ in stays).values()), describe(stays)
    assert not [module for module, _, up in stays if up], describe(stays)
    assert (tmp_path / "summary.json").is_file()


@pytest.mark.end_to_end
def test_an_experiments_grid_checks_each_run_once_and_hands_the_checked_config_to_it(tmp_path):
    """A grid of two runs: each run config is parsed and preflighted once, by the grid, before
    either run starts; each run takes its checked config and passes each module once."""
    from clusterfed.experiments.grids import run_experiment
    from clusterfed.experiments.spec import parse_experiment

    values = {key: value for key, value in tiny_run(tmp_path).to_flower().items()
              if key in ("dataset", "num-clients", "num-groups", "label-groups", "rounds", "log-to")}
    experiment = parse_experiment({"strategies": ["fedavg", "fedclust"], "seeds": [0],
                                   "grid": [{"folder": "grid", "config": values}]},
                                  source="test", base_dir=tmp_path, name="test", out=tmp_path / "out",
                                  skip_missing_data=False)
    entries = config_entries(lambda: run_experiment(experiment, stream=None))
    calls = Counter((function, label) for _, function, _, label in entries
                    if function in ("parse_config", "preflight", "check_partition"))
    # before: 3 preflights and 3 partition splits for 2 runs (the grid preflighted the first run
    # of each partition, then each run itself); 26 stays in 10 modules, 4 returns up
    assert calls == Counter({("parse_config", "fedavg"): 1, ("parse_config", "fedclust"): 1,
                             ("preflight", "fedavg"): 1, ("preflight", "fedclust"): 1,
                             ("check_partition", "fedavg"): 1}), calls  # the two runs share one partition
    stays = stays_of(entries)
    assert not [module for module, _, up in stays if up], describe(stays)
    modules = [module for module, _, _ in stays]
    starts = [i for i, module in enumerate(modules) if module == "clusterfed/simulation"]
    assert len(starts) == 2, describe(stays)
    for start in starts:  # a run, from simulate until the grid takes over again: no check, each module once
        run = modules[start:modules.index("clusterfed/experiments/grids", start)]
        assert run[:2] == ["clusterfed/simulation", "clusterfed/server_app"], describe(stays)
        assert "clusterfed/runner/preflight" not in run and "clusterfed/config" not in run, describe(stays)
        assert len(set(run)) == len(run), describe(stays)
    assert (tmp_path / "out" / "grid" / "comparison.csv").is_file()


def test_strategy_params_are_validated_once_and_the_strategy_built_from_them(monkeypatch):
    calls = []
    validate = FedClust.Params.model_validate.__func__

    def counting(cls, value, *args, **kwargs):
        calls.append(value)  # an instance too: pydantic would run its model validators again
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
