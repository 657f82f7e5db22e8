"""A device installs only the core dependencies: the ClientApp must import without the server's."""

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


def test_core_dependencies_leave_out_the_server_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "flwr==1.41.0" in core and "[simulation]" not in core
    assert not any(name in core for name in ("scipy", "scikit-learn", "matplotlib", "ray"))
    server = " ".join(project["optional-dependencies"]["server"]).lower()
    assert all(name in server for name in ("flwr[simulation]", "scipy", "scikit-learn", "matplotlib"))
    assert any(dep.startswith("clusterfed[server]") for dep in project["optional-dependencies"]["dev"])


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
