"""The message contract between the server and client apps (see DESIGN.md), in one place.

Record keys, the config keys a client needs to build its data and model, array
conversion and byte counting. Both apps import this; nothing here trains or clusters.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

# record names inside a message's RecordDict
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
CLIENT = "client"  # ConfigRecord of the reply: client-key, true-group (metrics only)

# custom query used once per client to learn its stable key before anything is sent to it
PROFILE_QUERY = "query.profile"

UPLOAD_FULL = "full"
RETURN_WEIGHTS = "weights"
RETURN_UPDATE = "update"

# run-config keys a client needs to rebuild its partition and model; the server sends
# them in every message, so simulation via the Python API (whose clients see an empty
# run config) and deployment behave the same
CLIENT_SPEC_KEYS = (
    "dataset",
    "data-dir",
    "partitioner",
    "num-clients",
    "num-groups",
    "alpha",
    "beta",
    "labels-per-client",
    "label-groups",
    "rotations",
    "min-samples",
    "test-fraction",
    "model",
    "seed",
    "batch-size",
    "momentum",
    "device",
    # fault injection (off by default) and the timeout a slow fault must miss
    "fault-rate",
    "fault-nan-rate",
    "fault-shape-rate",
    "fault-slow-rate",
    "fault-delay",
    "timeout",
)


def client_spec(flower_config: Mapping[str, object]) -> dict[str, object]:
    return {key: flower_config[key] for key in CLIENT_SPEC_KEYS}


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def array_bytes(record: ArrayRecord | None) -> int:
    """Payload bytes of the arrays in a record: the sum of each array's ``nbytes``."""
    if record is None:
        return 0
    return sum(int(np.prod(array.shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize for array in record.values())


def message_array_bytes(content: RecordDict) -> int:
    return sum(array_bytes(record) for record in content.array_records.values())


def parse_upload(value: str) -> list[str] | None:
    """``full`` -> None (everything), else the comma-separated array names."""
    if value == UPLOAD_FULL:
        return None
    return [name for name in value.split(",") if name]


def config_record(values: Mapping[str, object]) -> ConfigRecord:
    return ConfigRecord({k: v for k, v in values.items() if v is not None})
