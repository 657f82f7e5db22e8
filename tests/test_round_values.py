"""Per-round values live in the round (``Round``), not on the strategy: the driver hands a round
its active clients, train config and client table as arguments and gets the round's reports
back in its result; no strategy module reads or writes them as attributes of itself."""

from __future__ import annotations

import ast
from pathlib import Path
from types import MappingProxyType

import pytest
from flwr.app import ConfigRecord
from harness import drive_round, hand, make, reply_to, round_of, trained

import clusterfed
from clusterfed.core.exchange import ClientInfo, NewcomersPlaced, Replies, Round, RoundResult
from clusterfed.strategies import strategy_class

PACKAGE = Path(__file__).resolve().parents[1] / "clusterfed"
ROUND_VALUES = ("active", "sampled", "train_config", "reports", "clients")


def self_reads_of_round_values(path: Path) -> list[str]:
    """``self.<one of ROUND_VALUES>`` in ``path``, outside the class ``Round`` (whose own fields they are)."""
    tree = ast.parse(path.read_text())
    inside_round = {id(node) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) and cls.name == "Round"
                    for node in ast.walk(cls)}
    return [f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} self.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ROUND_VALUES and isinstance(node.value, ast.Name)
            and node.value.id == "self" and id(node) not in inside_round]


def test_no_strategy_module_keeps_a_round_value_on_itself():
    found = [hit for folder in ("strategies", "core") for path in sorted((PACKAGE / folder).rglob("*.py"))
             for hit in self_reads_of_round_values(path)]
    assert not found
    sample = PACKAGE.parent / "tests" / "strategy_fixtures" / "finalsign.py"  # an outside author's strategy too
    assert "self.active" not in sample.read_text() and "self.sampled" not in sample.read_text()


def test_the_check_sees_a_round_value_read_on_self(tmp_path):
    module = PACKAGE / "strategies" / "_probe_round_values.py"
    try:
        module.write_text("class S:\n    def f(self):\n        return self.active, self.clients['a']\n"
                          "class Round:\n    def g(self):\n        return self.active\n")
        assert [hit.split(" ")[1] for hit in self_reads_of_round_values(module)] == ["self.active", "self.clients"]
    finally:
        module.unlink()


@pytest.mark.parametrize("name", ["FedAvg", "FedClust", "HiCFL"])
def test_a_strategy_has_no_round_value_after_a_run(name):
    from test_diagnostics import user_grid

    strategy = getattr(clusterfed, name)()
    grid, arrays = user_grid(4)
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=2, train_config=ConfigRecord({"lr": 0.1}))
    assert not [value for value in ROUND_VALUES if hasattr(strategy, value)]


def test_round_steps_hands_the_round_its_values_and_returns_its_reports():
    """The round's values are what ``round_steps`` is handed (the client table read-only);
    its reports (here a FedClust newcomer's placement) come back in the ``RoundResult``."""
    groups = {str(i): i % 2 for i in range(4)}
    algorithm = make(strategy_class("fedclust"), groups)
    drive_round(algorithm, 1, lambda ask: trained(ask, 0.1 if groups[ask.key] == 0 else -0.1))
    table = {**hand(algorithm).clients, "9": ClientInfo("9", 50, 1)}
    steps = algorithm.round_steps(2, [*groups, "9"], {"lr": 0.05, "local-epochs": 1}, table)
    try:
        asks = next(steps)
        while True:
            asks = steps.send(Replies([reply_to(ask, trained(ask, 0.1)) for ask in asks]))
    except StopIteration as done:
        result = done.value
    assert isinstance(result, RoundResult) and isinstance(result.diagnostics, dict)
    (placed,) = result.reports
    assert isinstance(placed, NewcomersPlaced) and [e["client"] for e in placed.entries] == ["9"]
    rnd = round_of(algorithm, 3)
    assert isinstance(rnd.clients, MappingProxyType) and rnd.placed(algorithm.assignment) == list(groups)
    with pytest.raises(TypeError):
        rnd.clients["x"] = ClientInfo("x", 1, 0)  # the table is the driver's


def test_reachable_is_the_sample_or_everyone():
    rnd = Round(1, ["a", "b", "c"])
    assert rnd.reachable(["c", "a"]) == ["c", "a"]
    rnd.sampled = ["a"]
    assert rnd.reachable(["c", "a"]) == ["a"]
    assert rnd.members({"a": 0, "b": 1, "z": 0}, 0) == ["a"]
