"""What each install holds: the device's ClientApp imports without the server's packages, the
library and its strategies without torch, and the dependencies are ranges."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_ONLY = ("scipy", "sklearn", "matplotlib", "ray")

_BLOCKED_IMPORT = f"""
import importlib.abc, sys
BLOCKED = {SERVER_ONLY!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed on a device")
sys.meta_path.insert(0, Block())
import clusterfed.client_app, clusterfed.client_entry, clusterfed.client_worker
from clusterfed.datasets.device_data import load_device_data
print("imported", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_client_app_imports_without_server_only_packages():
    done = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("imported []")


def test_the_blocker_really_blocks():
    code = _BLOCKED_IMPORT.replace("import clusterfed.client_app, clusterfed.client_entry, clusterfed.client_worker", "import scipy")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "not installed on a device" in done.stderr


def test_dependencies_are_ranges_that_hold_both_tested_flowers_and_torch_is_an_extra():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    core = {Requirement(dep).name: Requirement(dep) for dep in project["dependencies"]}
    assert set(core) == {"flwr", "numpy", "pydantic", "scipy", "scikit-learn"}  # a server's whole install
    for requirement in [*core.values(), *map(Requirement, extras["torch"] + extras["simulation"] + extras["datasets"] + extras["privacy"])]:
        assert requirement.specifier and not any(s.operator == "==" for s in requirement.specifier), requirement
    for flwr in (core["flwr"], Requirement(extras["simulation"][0])):
        assert all(flwr.specifier.contains(version) for version in ("1.41.0", "1.42.0")), flwr
    torch = [Requirement(dep) for dep in extras["torch"] if dep.startswith("torch")]
    assert {str(r.marker) for r in torch} == {'platform_machine != "aarch64"', 'platform_machine == "aarch64"'}
    assert "2.9.1" in next(r for r in torch if "==" in str(r.marker) and r.name == "torch").specifier
    assert {Requirement(dep).name for dep in extras["server"]} == {"clusterfed", "matplotlib"}
    assert Requirement(extras["dev"][0]).extras == {"torch", "server", "simulation", "datasets", "privacy"}


_WITHOUT_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"{name} is not installed on this server")
sys.meta_path.insert(0, NoTorch())
import clusterfed
for name in ("FedAvg", "FedProx", "FedClust", "AdaCFL", "CFL", "LayerCFL", "HiCFL", "IFCA", "ClientSelection"):
    strategy = getattr(clusterfed, name)(fraction_train=1.0)
    strategy.configure_train  # the Flower Strategy surface a ServerApp uses
import clusterfed.server_app, clusterfed.cli, clusterfed.client  # the built-in app's modules load too
print("torch:", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision")))
"""


def test_the_library_and_every_strategy_load_without_torch():
    """`pip install clusterfed` has no torch: importing the package, constructing every strategy and
    loading the ServerApp/CLI modules must not need it (the sklearn example runs a whole
    FedClust/CFL federation so: tests/test_examples.py)."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("torch: []")


def test_app_bundle_holds_the_package_only(tmp_path):
    import io
    import shutil
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    app = tmp_path / "app"
    shutil.copytree(ROOT / "clusterfed", app / "clusterfed", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy(ROOT / name, app / name)
    for extra in ("tests/test_x.py", "benchmarks/grid.py", "benchmarks/results/r.json", "results/run/summary.json",
                  "docker/compose.yml", "docker/Dockerfile", "scripts/make-certs.sh"):
        (app / extra).parent.mkdir(parents=True, exist_ok=True)
        (app / extra).write_text("{}\n")
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))).namelist()
    assert "clusterfed/client_app.py" in names and "clusterfed/datasets/device_data.py" in names
    assert not [name for name in names if name.split("/")[0] in ("tests", "benchmarks", "results", "docker", "scripts")]
