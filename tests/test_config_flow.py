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
    # modules, 1 return up (the server app took the config back after preflight); then the
    # server app read the checked config once and handed each part what it takes; now simulate
    # checks it at the top (both engines) and hands the checked run down
    assert [module for module, _, _ in stays][:2] == ["clusterfed/simulation",
                                                      "clusterfed/runner/preflight"], describe(stays)
    assert "clusterfed/server_app" in [module for module, _, _ in stays], describe(stays)
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
        assert run[:3] == ["clusterfed/simulation", "clusterfed/runner/inprocess", "clusterfed/server_app"], \
            describe(stays)
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


# the modules of the built-in app above the runner: the run config comes down through them
APP_MODULES = ("clusterfed/cli", "clusterfed/simulation", "clusterfed/server_app", "clusterfed/client_app")
WATCHED = ("parse_config", "preflight", "RunConfig.to_flower", "RunOptions.__init__")


def cli_run_calls(argv) -> tuple[Counter, list[tuple[str, str]]]:
    """(how often each of ``WATCHED`` ran, each call from ``APP_MODULES`` into ``clusterfed.runner``
    as (caller, callee)) while ``clusterfed <argv>`` runs."""
    from clusterfed.cli import main

    counts: Counter = Counter()
    into_runner: list[tuple[str, str]] = []

    def module_of(code) -> str | None:
        if not code.co_filename.startswith(str(PACKAGE)):
            return None
        return Path(code.co_filename).relative_to(PACKAGE.parent).with_suffix("").as_posix()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_qualname in WATCHED:
            counts[code.co_qualname] += 1
        elif code.co_name == "__init__" and type(frame.f_locals.get("self")).__name__ == "RunOptions":
            counts["RunOptions.__init__"] += 1  # a dataclass's __init__, compiled from a string
        callee = module_of(code)
        if (callee is not None and callee.startswith("clusterfed/runner/") and frame.f_back is not None
                and not code.co_qualname.startswith("Checked.")):  # the handed-down run's own accessors
            caller = module_of(frame.f_back.f_code)
            if caller in APP_MODULES:
                into_runner.append((f"{caller}:{frame.f_back.f_code.co_qualname}", f"{callee}:{code.co_qualname}"))

    sys.setprofile(profile)
    try:
        assert main(argv) == 0
    finally:
        sys.setprofile(None)
    return counts, into_runner


@pytest.mark.end_to_end
def test_clusterfed_run_builds_the_run_once_and_hands_it_down(tmp_path):
    """``clusterfed run``: the config is parsed once (``config.py``, its owner), checked and turned
    into the runner's terms once (``preflight``: the flat config, the driver's ``RunOptions``, the
    clients' train and evaluate configs), and handed down as it is. The app's modules enter the
    runner once per part it takes, never with the config's fields one by one (before: the grid,
    the driver's options and start were given 13 fields read off the config in simulate and
    run_server, the config was preflighted inside run_server, and made flat twice)."""
    values = tiny_run(tmp_path).to_flower()
    argv = ["run", "--engine", "inprocess", "--out", str(tmp_path)]
    for key in ("strategy", "dataset", "num-clients", "num-groups", "label-groups", "rounds", "log-to"):
        argv += ["--set", f"{key}={values[key]!r}" if isinstance(values[key], str) else f"{key}={values[key]}"]
    counts, into_runner = cli_run_calls(argv)
    # the RunOptions copy run_server adds its recorder to is dataclasses.replace's, the second __init__
    assert counts == Counter({"parse_config": 1, "preflight": 1, "RunConfig.to_flower": 1,
                              "RunOptions.__init__": 2}), counts
    assert into_runner == [
        ("clusterfed/simulation:simulate", "clusterfed/runner/preflight:preflight"),  # the config, once
        ("clusterfed/simulation:simulate", "clusterfed/runner/inprocess:InProcessGrid.for_run"),  # the checked run
        ("clusterfed/server_app:wait_for_federation", "clusterfed/runner/transport:wait_for_nodes"),
        ("clusterfed/server_app:run_server", "clusterfed/runner/strategy_runner:new_driver"),  # checked.options
        ("clusterfed/server_app:run_server", "clusterfed/runner/driver:RoundDriver.start"),  # checked.start_args()
        # after the run, no config: the client table the final clusters' reasons may quote
        ("clusterfed/server_app:run_server", "clusterfed/runner/membership:Membership.table"),
    ], into_runner
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "rounds.jsonl").is_file()
