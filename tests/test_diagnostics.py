"""A strategy's round diagnostics are what its hooks return: ``round`` hands them to the
driver, which writes them into the round's row of rounds.jsonl (and its train loss into the
round's log line); no strategy keeps a dict the driver reads."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from clusterfed.strategies import REGISTRY, Steps, steps, strategy_class
from clusterfed.strategies.base import ClusteredStrategy
from clusterfed.core.exchange import Round, natural

PACKAGE = Path(__file__).resolve().parents[1] / "clusterfed"
IN_PLACE = {"update", "setdefault", "append", "extend", "insert", "pop", "clear", "add", "discard", "remove"}
# nothing of a round is written into the strategy: its reports go into its Round
NOT_STATE: set[str] = set()


class Noted(ClusteredStrategy):
    """FedAvg whose three hooks each return a diagnostic: placement (a plain method), a
    probe of the placed clients from round 2 on (a generator) and the training replies."""

    name = "noted"

    def admit(self, rnd: Round, keys: list[str]) -> dict:
        super().admit(rnd, keys)
        return {"admitted": sorted(keys, key=natural)}

    def before_train(self, rnd: Round) -> Steps:
        keys = self.placed(rnd) if rnd.number > 1 else []
        replies = (yield self.train_asks(rnd, keys, phase="probe")) if keys else []
        return {"probed": sorted((reply.key for reply in replies), key=natural)}

    def after_train(self, rnd: Round, replies) -> dict:
        return {"trained": len(replies)}


def user_grid(num_clients: int):
    """A user's own app: stock ClientApps on an in-process grid, and their model's arrays."""
    import torch
    from flwr.app import ArrayRecord
    from flwr.supercore.task_identity import TaskIdentity
    from userapp.client_app import app as stock_client_app
    from userapp.task import Net

    from clusterfed.runner.inprocess import InProcessGrid

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    torch.manual_seed(0)
    grid = InProcessGrid(stock_client_app, num_clients, node_configs=[{"partition-id": i} for i in range(num_clients)])
    return grid, ArrayRecord(Net().state_dict())


def test_the_hooks_returned_diagnostics_reach_rounds_jsonl_and_the_round_line(tmp_path, caplog):
    from flwr.app import ConfigRecord

    from clusterfed.results import RunRecorder
    from clusterfed.runner.driver import RunOptions

    caplog.set_level(logging.INFO, logger="flwr")
    strategy = Noted()
    strategy.run_options = RunOptions(recorder=RunRecorder(tmp_path, {"rounds": 2}, stream=None))
    grid, arrays = user_grid(4)
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=2, train_config=ConfigRecord({"lr": 0.1}))
    first, second = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    keys = [f"node-{1000 + i}" for i in range(4)]
    assert first["admitted"] == keys and "admitted" not in second  # placed once
    assert first["probed"] == [] and second["probed"] == keys  # a generator hook's return value
    assert first["trained"] == second["trained"] == 4
    columns = list(second)
    assert columns.index("probed") < columns.index("trained") < columns.index("train_loss")  # in the order they ran
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("[ROUND 2/2]"))
    assert f"train loss {second['train_loss']:.4g}" in line


def test_flowers_single_phase_hooks_collect_the_same_diagnostics(caplog):
    from flwr.app import ArrayRecord, ConfigRecord

    from clusterfed import protocol

    caplog.set_level(logging.DEBUG, logger="flwr")
    grid, arrays = user_grid(3)
    strategy = Noted()
    strategy.init(protocol.from_array_record(arrays))
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord({"lr": 0.1}), grid))
    strategy.aggregate_train(1, grid.send_and_receive(messages))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round 1 diagnostics")]
    assert "'admitted': ['node-1000', 'node-1001', 'node-1002'], 'probed': [], 'trained': 3, 'train_loss'" in line


def test_a_hook_returning_something_other_than_a_dict_is_named_a_type_error():
    def hook():
        yield []
        return ["not", "a", "dict"]

    run = steps(hook())
    next(run)
    with pytest.raises(TypeError, match="a strategy hook returned a list: a hook returns its diagnostics"):
        run.send([])
    assert list(steps(None)) == [] and list(steps({"a": 1})) == []  # plain methods ask nothing


def written_in_place(tree: ast.AST) -> set[str]:
    """The attributes of ``self`` a module writes into (``self.x[k] = v``, ``self.x.update(...)``, ...)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = [t.value for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                       if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in IN_PLACE:
            targets = [node.func.value]
        else:
            continue
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return found


def test_a_strategy_writes_in_place_only_its_declared_state():
    """Every dict or list a strategy fills in place is a field of its ``State`` (checkpointed:
    it decides later rounds); what a round reports is returned, not left in a shared dict."""
    sample = 'self.notes["x"] = 1\nself.log.setdefault("a", []).append(2)\nself.models[0] = m\nlocal["y"] = 3'
    assert written_in_place(ast.parse(sample)) == {"notes", "log", "models"}  # the check sees them
    found = {}
    for name in REGISTRY:
        cls = strategy_class(name)
        if not issubclass(cls, ClusteredStrategy):
            continue
        fields = {field.name for field in dataclasses.fields(cls.State)} | NOT_STATE
        for klass in cls.__mro__:
            module = inspect.getmodule(klass)
            if module is not None and module.__name__.startswith("clusterfed.strategies"):
                extra = written_in_place(ast.parse(inspect.getsource(module))) - fields
                found.update({f"{name} ({Path(module.__file__).name})": sorted(extra)} if extra else {})
    assert not found


def test_no_module_names_a_shared_round_dict():
    hits = [(path.relative_to(PACKAGE).as_posix(), node.lineno) for path in PACKAGE.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if "round_extra" in (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                                 else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                                 else "")]
    assert not hits


def assigned_attributes(tree: ast.AST) -> dict[str, int]:
    """``self.<name> = ...`` (plain, annotated or augmented) outside ``__init__``: name -> line."""
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name == "__init__":
            continue
        for node in ast.walk(function):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for leaf in ast.walk(target):
                    if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self"
                            and isinstance(leaf.ctx, ast.Store)):
                        found.setdefault(leaf.attr, leaf.lineno)
    return found


def test_a_strategy_remembers_nothing_outside_its_state():
    """What a strategy sets on itself after construction is one of the attributes its
    constructor made (per run or per round: the active keys, the round's sample, …) or its
    ``State`` object; anything else would decide later rounds without being checkpointed."""
    sample = "class A:\n def __init__(self): self.a = 1\n def f(self): self.b = 2; self.state.c = 3; self.d += 1"
    assert assigned_attributes(ast.parse(sample)) == {"b": 3, "d": 3}  # the check sees them (line 3)
    found = {}
    for name in REGISTRY:
        cls = strategy_class(name)
        if not issubclass(cls, ClusteredStrategy):
            continue
        made = set(vars(cls())) | {"state"}
        for klass in cls.__mro__:
            if klass.__module__.startswith("clusterfed.strategies"):
                extra = {attr: line for attr, line in assigned_attributes(ast.parse(inspect.getsource(klass))).items()
                         if attr not in made}
                found.update({f"{name} ({klass.__name__})": extra} if extra else {})
    assert not found


def test_a_state_field_used_as_an_attribute_gets_one_clear_message():
    """A strategy written as ``self.<field>`` for a ``State`` field (how they were once
    written) is told where the field lives, reading or writing; nothing lands outside the state."""
    strategy = strategy_class("cfl")()
    with pytest.raises(AttributeError, match=r"CFL.tree is a field of CFLState: read it as self.state.tree"):
        strategy.tree
    with pytest.raises(AttributeError, match=r"write it as self.state.assignment"):
        strategy.assignment = {}
    assert "assignment" not in vars(strategy)
    with pytest.raises(AttributeError, match=r"has no attribute 'nothing_like_it'"):
        strategy.nothing_like_it


def test_an_undeclared_attribute_after_init_and_a_parameter_read_as_an_attribute_are_named():
    """Once a strategy has started (``init``) or resumed (``set_state``), a new attribute would
    decide later rounds and be lost on resume: it is refused, naming the State to add it to.
    A parameter read as ``self.<name>`` is pointed at ``self.params``."""
    strategy = strategy_class("fedavg")()
    strategy.before_init = 1  # construction time: allowed
    strategy.init({"w": np.zeros(3, dtype=np.float32)})
    with pytest.raises(AttributeError, match=r"FedAvg.rounds_done is not declared: add it to ClusteredState"):
        strategy.rounds_done = 1
    strategy.run_options = None  # what the constructor made stays writable
    resumed = strategy_class("fedavg")()
    resumed.set_state(strategy.get_state())
    with pytest.raises(AttributeError, match="is not declared"):
        resumed.rounds_done = 1
    with pytest.raises(AttributeError, match=r"FedAvg.fraction_train is a parameter: read it as self.params.fraction_train"):
        strategy.fraction_train


def test_a_diagnostic_named_like_a_column_of_the_round_stops_the_run_naming_it(tmp_path):
    """A hook's diagnostic under a name of rounds.jsonl's own columns (``clusters``: each
    cluster's accuracy and size, which the report and plots read) would overwrite it: refused."""
    from clusterfed.results import RunRecorder, Traffic

    recorder = RunRecorder(tmp_path, {"strategy": "fedavg", "rounds": 1}, stream=None)
    with pytest.raises(ValueError, match=r"round 1: the round's diagnostics \['clusters'\] have the names of rounds.jsonl"):
        recorder.record_round(1, evals=[], assignment={}, true_groups={}, traffic=Traffic(), round_seconds=0.1,
                              extra={"moved": 1, "clusters": 2})
    recorder.record_round(1, evals=[], assignment={}, true_groups={}, traffic=Traffic(), round_seconds=0.1,
                          extra={"moved": 1, "cluster_models": 2})
    assert recorder.rounds[-1]["cluster_models"] == 2
