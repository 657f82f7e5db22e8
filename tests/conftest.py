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
