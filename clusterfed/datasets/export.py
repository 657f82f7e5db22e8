"""Write a partition to disk, one file per client, for copying onto devices.

``part-<i>.npz`` holds client i's ``x_train, y_train, x_test, y_test`` exactly as the
simulation's client i trains on them (float32 ``(N, C, H, W)``, normalised with the pool's
statistics, rotated and label-permuted) and its ``true_group``; ``manifest.json`` records the
data settings, every file's sha256, true group and sample counts. A SuperNode reads its file
with ``--node-config 'data-path="part-3.npz" client-key="pi-03"'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .device_data import file_sha256
from .partition import client_arrays, make_partition
from .partition_base import Partition
from .sources import DataSource, load_source

# the run-config keys that decide the data a client gets (model, batch size, device do not)
PARTITION_KEYS = ("dataset", "data-dir", "partitioner", "num-clients", "num-groups", "alpha", "beta",
                  "labels-per-client", "label-groups", "rotations", "min-samples", "test-fraction", "seed")


def build_partition(spec: Mapping[str, object]) -> tuple[DataSource, Partition]:
    """The pool and partition that the run-config keys in `spec` (kebab-case) describe."""
    source = load_source(str(spec["dataset"]), str(spec["data-dir"]) or None)
    return source, make_partition(
        source.y,
        source.num_classes,
        name=str(spec["partitioner"]),
        num_clients=int(spec["num-clients"]),
        num_groups=int(spec["num-groups"]),
        alpha=float(spec["alpha"]),
        beta=float(spec["beta"]),
        labels_per_client=int(spec["labels-per-client"]),
        label_groups=str(spec["label-groups"]),
        rotations=str(spec["rotations"]),
        min_samples=int(spec["min-samples"]),
        test_fraction=float(spec["test-fraction"]),
        seed=int(spec["seed"]),
    )


def export_partition(spec: Mapping[str, object], out_dir: str | Path) -> dict:
    """Write ``part-<i>.npz`` per client and ``manifest.json`` to `out_dir`; return the manifest."""
    settings = {key: spec[key] for key in PARTITION_KEYS}
    source, partition = build_partition(settings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clients = []
    for i, part in enumerate(partition.clients):
        x_train, y_train, x_test, y_test = client_arrays(source, part)
        path = out / f"part-{i}.npz"
        np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                 true_group=np.int64(part.group))
        clients.append({"partition-id": i, "file": path.name, "sha256": file_sha256(path),
                        "true-group": int(part.group), "train-samples": len(y_train), "test-samples": len(y_test)})
    manifest = {
        "settings": settings,
        "num-classes": source.num_classes,
        "input-shape": list(source.input_shape),
        "x-format": "float32 (N, C, H, W), normalised per channel with the whole pool's statistics",
        "clients": clients,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
