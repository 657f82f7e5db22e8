"""examples/: each a Flower app a user copies. Their apps run in-process (each example's own
run_inprocess.py, on clusterfed's InProcessGrid) with few rounds: the planted groups are
recovered and clustering beats FedAvg; each folder has its files; each pyproject's
components are importable ServerApp / ClientApp objects; the app code imports clusterfed's
public API only. `flwr run` itself is not run here (Ray and a SuperLink: tens of seconds)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

import clusterfed

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PACKAGES = {"sensor-clusters": "sensor_clusters", "ifca-regression": "ifca_regression",
            "sklearn-clusters": "sklearn_clusters"}
FILES = ["pyproject.toml", "README.md", "run_inprocess.py", "{pkg}/__init__.py", "{pkg}/client_app.py",
         "{pkg}/server_app.py", "{pkg}/task.py"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on shared cores
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def example_paths():
    sys.path[:0] = [str(EXAMPLES / name) for name in PACKAGES]
    yield
    for name in PACKAGES:
        sys.path.remove(str(EXAMPLES / name))


def runner(example: str):
    """The example's run_inprocess.py as a module (its ``simulate``)."""
    spec = importlib.util.spec_from_file_location(f"run_inprocess_{PACKAGES[example]}",
                                                  EXAMPLES / example / "run_inprocess.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quietly(function, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        value = function(*args)
    return value, out.getvalue()


def pyproject(example: str) -> dict:
    return tomllib.loads((EXAMPLES / example / "pyproject.toml").read_text())


# ---------------------------------------------------------------- the folders
@pytest.mark.parametrize("example", PACKAGES)
def test_each_example_has_its_files(example):
    missing = [f.format(pkg=PACKAGES[example]) for f in FILES
               if not (EXAMPLES / example / f.format(pkg=PACKAGES[example])).is_file()]
    assert not missing


@pytest.mark.parametrize("example", PACKAGES)
def test_pyproject_is_a_flower_app_whose_components_import(example):
    from flwr.cli.config_utils import load_and_validate

    _, warnings = load_and_validate(EXAMPLES / example / "pyproject.toml", check_module=True)  # what `flwr run` checks
    assert not warnings
    flwr = pyproject(example)["tool"]["flwr"]
    assert flwr["app"]["publisher"] and flwr["app"]["config"]["num-server-rounds"] >= 1
    assert flwr["federations"]["default"] == "local-simulation"  # run_app_inprocess's grid: its num-supernodes
    assert flwr["federations"]["local-simulation"]["options"]["num-supernodes"] >= 2
    kinds = {"serverapp": ServerApp, "clientapp": ClientApp}
    for component, reference in flwr["app"]["components"].items():
        module, _, name = reference.partition(":")
        assert module.split(".")[0] == PACKAGES[example]
        assert isinstance(getattr(importlib.import_module(module), name), kinds[component]), reference


@pytest.mark.parametrize("example", PACKAGES)
def test_the_app_code_uses_only_clusterfeds_public_api(example):
    for path in (EXAMPLES / example / PACKAGES[example]).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) else
                       [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for module in modules:
                if module and module.split(".")[0] == "clusterfed":
                    assert module in ("clusterfed", "clusterfed.client"), (path.name, module)


def test_the_one_line_change_is_visible_in_the_sensor_server_app():
    lines = [line.strip() for line in (EXAMPLES / "sensor-clusters/sensor_clusters/server_app.py").read_text().splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("strategy = FedClust("))
    assert lines[at - 1].startswith("# strategy = FedAvg(") and lines[at + 1].startswith("# strategy = CFL(")


# ---------------------------------------------------------------- (a) a stock ClientApp, FedClust
@pytest.mark.end_to_end
def test_sensor_clusters_fedclust_finds_the_machine_kinds_and_beats_fedavg():
    run = runner("sensor-clusters")
    (result, ari), printed = quietly(run.simulate)  # the ServerApp's main: FedClust, 5 rounds
    (fedavg, _), _ = quietly(run.simulate, "FedAvg")
    assert ari == 1.0 and len(result.cluster_arrays) == 3
    clustered, single = result.evaluate_metrics_clientapp[5]["eval_acc"], fedavg.evaluate_metrics_clientapp[5]["eval_acc"]
    assert clustered > 0.95 and single < 0.5 and clustered > single
    assert result.evaluate_metrics_clientapp[5]["num-examples"] == 12 * 60
    assert "round  train_loss   eval_loss    eval_acc" in printed and "3 cluster(s):" in printed
    assert printed.count("node-10") == 12  # the final assignment, every device once


# ---------------------------------------------------------------- (b) the client helper, IFCA and CFL
def test_ifca_regression_recovers_the_groups_with_lower_mse_than_fedavg():
    run = runner("ifca-regression")
    (ifca, ari), printed = quietly(run.simulate, None, 8)  # the ServerApp's main: IFCA
    (fedavg, fedavg_ari), _ = quietly(run.simulate, "FedAvg", 8)
    assert ari == 1.0 and len(ifca.cluster_arrays) == 4 and fedavg_ari == 0.0
    mse, fedavg_mse = ifca.evaluate_metrics_clientapp[8]["eval-mse"], fedavg.evaluate_metrics_clientapp[8]["eval-mse"]
    assert mse < 0.01 < 1.0 < fedavg_mse
    assert set(ifca.evaluate_metrics_clientapp[8]) == {"eval-mse", "num-examples"}
    assert "round  train-loss    eval-mse" in printed and "4 cluster(s)" in printed


def test_ifca_regression_with_cfl_as_the_readme_shows_recovers_the_groups():
    (result, ari), _ = quietly(runner("ifca-regression").simulate,
                               clusterfed.CFL(split_min_silhouette=0.6, fraction_train=1.0), 12)
    assert ari == 1.0 and result.evaluate_metrics_clientapp[12]["eval-mse"] < 0.01


# ---------------------------------------------------------------- (c) scikit-learn clients, a server without torch
_WITHOUT_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):  # as if torch were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"{name} is not installed on this server")
sys.meta_path.insert(0, NoTorch())
import contextlib, io, json
import clusterfed, run_inprocess
with contextlib.redirect_stdout(io.StringIO()) as printed:
    fedclust, fedclust_ari = run_inprocess.simulate()  # the ServerApp's main: FedClust, 5 rounds
    fedavg, fedavg_ari = run_inprocess.simulate("FedAvg", 2)
    cfl, cfl_ari = run_inprocess.simulate(
        clusterfed.CFL(fraction_train=1.0, min_split_round=2, split_min_silhouette=0.6), 8)
print(json.dumps({"fedclust": [fedclust_ari, fedclust.evaluate_metrics_clientapp[5]["eval-acc"], len(fedclust.cluster_arrays)],
                  "fedavg": [fedavg_ari, fedavg.evaluate_metrics_clientapp[2]["eval-acc"]],
                  "cfl": [cfl_ari, cfl.evaluate_metrics_clientapp[8]["eval-acc"]],
                  "printed": printed.getvalue(),
                  "torch_loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision"))}))
"""


@pytest.mark.end_to_end
def test_sklearn_clients_under_fedclust_and_cfl_recover_the_sites_on_a_server_without_torch():
    """A stock scikit-learn ClientApp (logistic regression as NumPy arrays) and the ServerApp, in a
    process where torch cannot be imported: FedClust and CFL find the three kinds of site."""
    import json
    import os
    import subprocess

    folder = EXAMPLES / "sklearn-clusters"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(EXAMPLES.parent)]))
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["torch_loaded"] == []
    (ari, accuracy, clusters), (fedavg_ari, fedavg_accuracy) = found["fedclust"], found["fedavg"]
    assert ari == 1.0 and clusters == 3 and accuracy > 0.95 and fedavg_ari == 0.0 and fedavg_accuracy < 0.5
    assert found["cfl"][0] == 1.0 and found["cfl"][1] > 0.95
    assert "3 cluster(s):" in found["printed"] and "round   eval-loss    eval-acc" in found["printed"]
