"""clusterfed experiment: an experiment file runs and writes manifests; a bad one is refused with one
message before any run; the settings registry is the only one."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from clusterfed.cli import main
from clusterfed.experiments import grids
from clusterfed.experiments.settings import SETTINGS, setting
from clusterfed.experiments.spec import load_experiment
from clusterfed.experiments.stats import mean_std

REPO = Path(__file__).resolve().parents[1]

TINY = """
description = "two strategies, one seed, two rounds"
strategies = ["fedavg", {strategy = "oracle", label = "oracle-x"}]
seeds = [0]
rounds = 2

[config]
checkpoint = false
num-clients = 8

[[grid]]
setting = "digits-label-swap"
config = { num-groups = 2 }
"""

MANIFEST_FIELDS = ("git", "config_hash", "versions", "machine", "command", "started", "ended", "wall_seconds")


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exp")
    path = folder / "tiny.toml"
    path.write_text(TINY)
    code = main(["experiment", str(path), "--out", str(folder / "out")])
    assert code == 0
    return folder / "out"


def test_experiment_runs_and_writes_tables(tiny_experiment):
    grid = tiny_experiment / "digits-label-swap"
    with (grid / "comparison.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["strategy"], r["seed"], r["rounds"]) for r in rows] == [("fedavg", "0", "2"), ("oracle-x", "0", "2")]
    assert (grid / "oracle-x" / "seed0" / "rounds.jsonl").exists()  # a variant's runs go under its label
    assert float(rows[1]["final_ari"]) == 1.0
    assert (grid / "comparison.md").read_text().startswith("| strategy |")
    timing = json.loads((tiny_experiment / "timing.json").read_text())
    assert timing["profile"] == "tiny" and timing["runs"] == 2
    assert timing["settings"]["digits-label-swap"] == {**timing["settings"]["digits-label-swap"],
                                                       "runs": 2, "rounds": 2, "seeds": [0]}


def test_every_result_folder_has_a_manifest(tiny_experiment):
    top = json.loads((tiny_experiment / "manifest.json").read_text())
    grid = json.loads((tiny_experiment / "digits-label-swap" / "manifest.json").read_text())
    for manifest in (top, grid):
        for name in MANIFEST_FIELDS:
            assert name in manifest, name
        assert set(manifest["git"]) == {"commit", "dirty"}
        assert {"flwr", "torch", "numpy", "scipy", "scikit-learn"} <= set(manifest["versions"])
        assert manifest["versions"]["flwr"]
        assert manifest["machine"]["cores"] >= 1
        assert len(manifest["machine"]["load_average_start"]) == 3 and len(manifest["machine"]["load_average_end"]) == 3
        assert len(manifest["config_hash"]) == 64
    assert "experiment" in top["command"]
    assert grid["grid"]["setting"] == "digits-label-swap" and len(grid["grid"]["runs"]) == 2
    assert grid["config_hash"] != top["config_hash"]


BAD = {
    "unknown setting": ('[[grid]]\nsetting = "digits-pairz"\n', ["unknown setting 'digits-pairz'", "digits-pairs"]),
    "unknown strategy": ('strategies = ["fedavg", "fedclsut"]\n[[grid]]\nsetting = "digits-pairs"\n',
                         ["unknown strategy 'fedclsut'", "fedclust"]),
    "bad top key": ('seed = [0]\n[[grid]]\nsetting = "digits-pairs"\n', ["unknown key 'seed'", "seeds"]),
    "bad run key": ('[[grid]]\nsetting = "digits-pairs"\nconfig = { num-cilents = 4 }\n', ["num-cilents"]),
    "bad value": ('rounds = 0\n[[grid]]\nsetting = "digits-pairs"\n', ["rounds"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_experiment_is_refused_before_any_run(case, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grids, "run_one", lambda *a, **k: pytest.fail("a run started"))
    text, expected = BAD[case]
    path = tmp_path / "bad.toml"
    path.write_text('strategies = ["fedavg"]\n' * ("strategies" not in text) + text)
    code = main(["experiment", str(path), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one message
    for part in expected:
        assert part in err, (part, err)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_every_problem_of_a_file_in_one_message(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('strategies = ["nope"]\nseeds = []\n[[grid]]\nsetting = "mnist-pairz"\n[[grid]]\nsetting = "digits-iid"\n')
    with pytest.raises(ValueError) as error:
        load_experiment(path)
    message = str(error.value)
    assert "3 problems" in message and "'mnist-pairz'" in message and "'nope'" in message and "seeds" in message


def test_the_benchmark_files_load():
    for path in sorted((REPO / "benchmarks" / "experiments").glob("*.toml")):
        experiment = load_experiment(path)
        assert experiment.grids, path


def test_registry_settings_are_valid_run_configs():
    from clusterfed.config import parse_config

    for name, values in SETTINGS.items():
        parse_config({**values, "out-dir": "unused"})
    assert setting("label-groups") == SETTINGS["digits-pairs"]  # the short names of earlier scripts


def _setting_dicts(path: Path) -> list[int]:
    """Lines of dict literals that name a partitioner: a setting defined outside the registry."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value == "partitioner" for k in node.keys)]


def test_the_settings_registry_is_the_only_one():
    found = {}
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        if "archive" in path.relative_to(REPO / "benchmarks").parts:
            continue
        lines = _setting_dicts(path)
        if lines:
            found[str(path.relative_to(REPO))] = lines
    for path in sorted((REPO / "clusterfed").rglob("*.py")):
        if path.name != "settings.py" and "SETTINGS: dict" in path.read_text():
            found[str(path.relative_to(REPO))] = ["SETTINGS"]
    assert not found, f"setting dicts outside clusterfed/experiments/settings.py: {found}"


def test_mean_std_is_one_function():
    assert mean_std([1.0, None, 3.0]) == (2.0, 1.0, 2, 3)
    assert mean_std([None]).format() == "–"
    assert mean_std([0.5]).format(3) == "0.500"
    assert mean_std([1.0, 2.0, None]).format(1) == "1.5 ± 0.5 (2/3)"


def test_a_failed_run_does_not_lose_the_others(tmp_path, monkeypatch, capsys):
    real = grids.run_one

    def flaky(config, engine, label=None):
        if label == "oracle-x":
            raise RuntimeError("boom")
        return real(config, engine, label)

    monkeypatch.setattr(grids, "run_one", flaky)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.replace("rounds = 2", "rounds = 1"))
    code = main(["experiment", str(path), "--out", str(tmp_path / "out")])
    assert code == 1
    assert "oracle-x/seed0: RuntimeError: boom" in capsys.readouterr().err
    with (tmp_path / "out" / "digits-label-swap" / "comparison.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["strategy"] for r in rows] == ["fedavg", "oracle-x"] and rows[1]["final_accuracy"] == ""
    timing = json.loads((tmp_path / "out" / "timing.json").read_text())
    assert list(timing["failures"]) == ["digits-label-swap/oracle-x/seed0"]


def test_runs_of_a_grid_made_in_pieces_merge_into_one_folder(tiny_experiment, tmp_path):
    """benchmarks/merge_runs.py: the other piece's runs join the folder's rows, counts stay integers."""
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("merge_runs", REPO / "benchmarks" / "merge_runs.py")
    merge_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(merge_runs)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    assert main(["experiment", str(path), "--out", str(tmp_path / "piece"), "--seeds", "1"]) == 0
    into = tmp_path / "into"
    shutil.copytree(tiny_experiment / "digits-label-swap", into)
    merged = merge_runs.merge(tmp_path / "piece" / "digits-label-swap", into, "seed1", merge_runs.grid_title(into))
    assert merged == ["fedavg/seed1", "oracle-x/seed1"]
    with (into / "comparison.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["strategy"], r["seed"], r["num_clusters"]) for r in rows] == [
        ("fedavg", "0", "1"), ("fedavg", "1", "1"), ("oracle-x", "0", "2"), ("oracle-x", "1", "2")]
    assert (into / "oracle-x" / "seed1" / "rounds.jsonl").exists() and (into / "manifest-seed1.json").exists()
    assert "seeds 0, 1" in (into / "comparison.md").read_text()


@pytest.mark.end_to_end
def test_the_memory_benchmark_answers_every_kind_of_ask_and_counts_what_is_kept(monkeypatch):
    """benchmarks/bench_scale_speed.py memory: the uploads it reports are the replies' array
    bytes; FedAvg keeps nothing per client, CFL at least one float32 update per client; an
    admission exchange (FedClust) and multi-model asks (IFCA) are answered too."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench = importlib.import_module("bench_scale_speed")
    monkeypatch.setattr(bench, "SETTING", "synthetic-rotation-10000")
    update_kb = sum(4 * int(np.prod(shape)) for shape in bench.model_shapes(bench.SETTING).values()) / 1024
    fedavg = bench.measure_memory("fedavg", 40, 2)
    assert fedavg["uploads_kb_per_client"] == round(update_kb, 2)
    assert abs(fedavg["retained_kb_per_client"]) < 1
    cfl = bench.measure_memory("cfl", 40, 2, {"cfl.min-split-round": 10_000})
    assert cfl["retained_kb_per_client"] >= update_kb
    # FedClust's clustering round on random replies finds no groups: it keeps every client's
    # final-layer change (float32) for a later cut, which the measurement must show
    final_layer = sum(int(np.prod(shape)) for name, shape in bench.model_shapes(bench.SETTING).items()
                      if name.startswith("fc2"))
    assert bench.measure_memory("fedclust", 40, 2)["retained_kb_per_client"] >= 4 * final_layer / 1024
    assert bench.measure_memory("ifca", 40, 2)["rounds"] == 2
