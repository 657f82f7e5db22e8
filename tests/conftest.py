"""Keep Flower's and Ray's state out of the user's home, and share small helpers."""

import os
import tempfile
from pathlib import Path

import pytest

_STATE = Path(tempfile.mkdtemp(prefix="clusterfed-tests-"))
os.environ.setdefault("FLWR_HOME", str(_STATE / "flwr"))
os.environ.setdefault("RAY_TMPDIR", str(_STATE / "ray"))
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")

SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "MNIST"


@pytest.fixture
def small_config(tmp_path):
    """A factory for quick digits runs written under tmp_path."""
    from clusterfed.config import parse_config

    def make(**overrides):
        values = {"num-clients": 6, "rounds": 2, "out-dir": str(tmp_path / "out"), "partitioner": "label-groups",
                  "label-groups": "0-4;5-9", "batch-size": 32}
        values.update({k.replace("_", "-"): v for k, v in overrides.items()})
        return parse_config(values)

    return make


# The files whose tests take longest (minutes each: deployments, resumed runs, golden runs,
# the model matrix), run first: with `make test`'s one process per core and whole files per
# process, a long file started last leaves the other processes idle while it finishes.
LONG_FILES = ("test_deployment.py", "test_checkpoint.py", "test_preflight.py", "test_golden.py",
              "test_model_matrix.py", "test_deployment_auth.py", "test_cfl_family_scale.py", "test_examples.py")


def pytest_collection_modifyitems(config, items):
    """Long files first, each file's tests in their own order (a stable sort by file)."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))
