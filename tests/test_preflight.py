"""Bad input stops before any client is contacted, with one clear message and no traceback;
keys the strategy does not read are named; product code never relies on ``assert``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterfed.config import parse_config

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "clusterfed.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("setting, message", [
    ("label-groups=0,1;x", "malformed label-groups"),
    ("num-clients=500", "partition"),
    ("out-dir=/etc/passwd/x", "out-dir '/etc/passwd/x' cannot be written"),
    ("test-fraction=0.99", "test-fraction 0.99 leaves client"),
    ("label-groups=", "label-groups is empty"),
    ("partitioner=rotation rotations=", "malformed rotations ''"),
])
@pytest.mark.end_to_end
def test_bad_input_ends_with_one_line_before_any_client(setting, message, tmp_path):
    args = ["run", "--engine", "inprocess"] + [a for part in setting.split(" ") for a in ("--set", part)]
    if not setting.startswith("out-dir"):
        args += ["--set", f"out-dir={tmp_path / 'out'}"]
    result = cli(*args)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("clusterfed:")]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "rounds.jsonl").exists()  # no round ran, no client was contacted


@pytest.mark.end_to_end
def test_every_problem_is_listed_at_once(tmp_path):
    result = cli("run", "--engine", "inprocess", "--set", "label-groups=0,1;x", "--set", "out-dir=/etc/passwd/x",
                 "--set", "model=mnist-cnn")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert "3 problems" in line and "label-groups" in line and "out-dir" in line and "mnist-cnn" in line


def test_keys_the_strategy_does_not_read_are_reported():
    from clusterfed import strategy_config

    strategy_config._SAID.clear()
    parse_config({"strategy": "fedclust", "eps1": 0.2})
    assert any("'eps1' is ignored" in m and "cfl" in m for m in strategy_config._SAID)
    strategy_config._SAID.clear()
    config = parse_config({"strategy": "cfl", "eps1": 0.2})
    assert config.strategy_params["eps1"] == 0.2
    assert strategy_config._SAID == {"config key 'eps1' is deprecated: use cfl.eps1"}
    strategy_config._SAID.clear()
    parse_config({"strategy": "fedavg"})
    assert strategy_config._SAID == set()


def test_product_code_has_no_assert_statements():
    """An ``assert`` vanishes under ``python -O``: checks that matter are explicit."""
    found = []
    for path in (ROOT / "clusterfed").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


@pytest.mark.end_to_end
def test_splits_happen_under_python_optimize(tmp_path):
    """CFL under ``python -O`` still makes its children (a split used to happen inside an assert)."""
    out = tmp_path / "run"
    settings = {"strategy": "cfl", "partitioner": "rotation", "num-clients": 8, "rounds": 4, "batch-size": 32,
                "split-criteria": "absolute", "eps1": 100.0, "eps2": 0.001, "split-min-silhouette": 0.0,
                "min-split-round": 2}
    args = [a for k, v in settings.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    result = subprocess.run([sys.executable, "-O", "-m", "clusterfed.cli", "run", "--engine", "inprocess",
                             "--out", str(out), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    clusters = json.loads((out / "clusters.json").read_text())
    assert len(clusters["splits"]) >= 1 and len(set(clusters["assignment"].values())) >= 2
