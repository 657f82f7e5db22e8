"""Print every built-in model's state_dict (name -> shape, dtype) as JSON, for each data set shape.

scripts/test-arm64.sh runs it with the device's torch (aarch64, in the emulated rootfs) and the
server's (x86_64) and compares: weights travel as plain float32 arrays, so a device may run
another torch release as long as the built-in models have the same names and shapes.
Also prints a SHA-256 of the seeded initial weights (informative: the server sends θ0).
"""

import hashlib
import json
import sys

import torch

from clusterfed.datasets.shapes import DATASET_SHAPES
from clusterfed.models import MODELS, build_model

out = {"torch": torch.__version__, "machine": __import__("platform").machine(), "models": {}}
for dataset, (shape, classes) in sorted(DATASET_SHAPES.items()):
    for name in MODELS:
        try:
            model = build_model(name, dataset, shape, classes, seed=0)
        except ValueError:
            continue  # this model does not fit this input size
        state = model.state_dict()
        digest = hashlib.sha256()
        for key, value in state.items():
            digest.update(key.encode() + value.detach().cpu().numpy().tobytes())
        out["models"][f"{name}/{dataset}"] = {
            "state_dict": {key: [list(value.shape), str(value.dtype)] for key, value in state.items()},
            "init_sha256": digest.hexdigest(),
        }
json.dump(out, sys.stdout, indent=1, sort_keys=True)
