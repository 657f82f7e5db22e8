"""A strategy is its module, its test and one registry line: a strategy module from
tests/strategy_fixtures/ is put in ``clusterfed.strategies`` (the package's search path
reaches the fixture folder) and registered with one ``REGISTRY`` entry; nothing else is
edited, and it gets a public name, a place in ``strategy_names()``, the
partial-participation smoke run and its entry in the generated reference. The author kit
it is written with is importable from ``clusterfed.strategies``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import clusterfed
import clusterfed.strategies as package
from clusterfed import reference
from clusterfed.strategies import clustered_classes, strategy_class, strategy_names

FIXTURES = Path(__file__).resolve().parent / "strategy_fixtures"
MODULE = f"{package.__name__}.finalsign"


@pytest.fixture
def registered(monkeypatch):
    """finalsign.py in the package, and the one line an author adds to REGISTRY."""
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(FIXTURES)])
    monkeypatch.setitem(package.REGISTRY, "finalsign", f"{MODULE}:FinalSign")
    yield
    sys.modules.pop(MODULE, None)
    if "finalsign" in vars(package):
        delattr(package, "finalsign")


def test_unregistered_the_module_is_nobody(monkeypatch):
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(FIXTURES)])
    assert "finalsign" not in strategy_names() and "FinalSign" not in clusterfed.__all__
    with pytest.raises(AttributeError):
        clusterfed.FinalSign  # noqa: B018
    assert "finalsign" not in reference.markdown()


def test_one_registry_line_makes_a_public_strategy(registered):
    from clusterfed import FinalSign

    assert FinalSign.__module__ == MODULE and clusterfed.FinalSign is FinalSign
    assert "FinalSign" in clusterfed.__all__ and "FinalSign" in dir(clusterfed)
    assert "finalsign" in strategy_names() and strategy_class("finalsign") is FinalSign
    assert clustered_classes()["finalsign"] is FinalSign
    from clusterfed.config import parse_config

    config = parse_config({"strategy": "finalsign", "finalsign.probe-epochs": 2})
    strategy = config.build_strategy()
    assert type(strategy) is FinalSign and strategy.params.probe_epochs == 2


def test_the_generated_reference_and_stub_carry_it(registered):
    import ast

    text = reference.markdown()
    assert "## `finalsign` — `clusterfed.FinalSign`" in text
    assert "Two clusters by the sign of the mean change of the final layer in a short probe." in text
    assert "| `finalsign.probe-epochs` | `1` | int |" in text
    assert "[tool.flwr.app.config.finalsign]\nprobe-epochs = 1" in reference.pyproject_section()
    assert "finalsign.probe-epochs = 1" in reference.strategy_help("finalsign")
    stub = ast.parse(reference.stub())
    (cls,) = [node for node in stub.body if isinstance(node, ast.ClassDef) and node.name == "FinalSign"]
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef))
    assert [a.arg for a in init.args.kwonlyargs][-1] == "probe_epochs"
    exported = next(node for node in stub.body if isinstance(node, ast.Assign))
    assert "FinalSign" in ast.literal_eval(exported.value)


def test_it_runs_the_partial_participation_smoke_run(registered, tmp_path, monkeypatch):
    """The default run (no entry in the smoke run's table): half the clients train each
    round and none is orphaned; its probe asked only the sample, for the final layer only,
    and what its hook returned is in every round's row."""
    from test_partial_participation import SAMPLE, check_partial_participation

    clusters = check_partial_participation("finalsign", tmp_path, monkeypatch)
    assert 0 < len(clusters["probed"]) and set(clusters["probed"]) <= set(clusters["assignment"])
    assert len([k for k, r in clusters["probed"].items() if r == max(clusters["probed"].values())]) == SAMPLE
    rows = [json.loads(line) for line in (tmp_path / "finalsign" / "rounds.jsonl").read_text().splitlines()]
    assert rows and all(row["probe_replies"] == SAMPLE for row in rows)


def test_the_author_kit_is_public():
    from clusterfed.models.layers import select_layers
    from clusterfed.protocol import UPLOAD_FULL, parse_upload, upload_names
    from clusterfed.strategies.base import Steps, steps
    from clusterfed.core.exchange import Ask

    assert package.select_layers is select_layers is clusterfed.select_layers
    assert package.Steps is Steps and package.steps is steps and package.upload_names is upload_names
    for name in package.AUTHOR_KIT:
        assert getattr(package, name) is not None, name
    names = ["fc2.weight", "fc2.bias"]
    value = upload_names(names)
    assert parse_upload(value) == names and Ask("0", {}, {"upload": value}).upload == names
    assert Ask("0", {}, {"upload": UPLOAD_FULL}).upload is None
    for bad in ([], ["a,b"], [""], [UPLOAD_FULL]):
        with pytest.raises(ValueError, match="upload needs"):
            upload_names(bad)
