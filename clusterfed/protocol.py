"""The message contract between the server and client apps (docs/message-contract.md), in one place.

Record keys, the config keys a client needs to build its data and model, array
conversion and byte counting. Both apps import this; nothing here trains or clusters.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

NUMPY_STYPE = "numpy.ndarray"  # flwr's SType.NUMPY: Array.data holds the .npy file bytes

# record names inside a message's RecordDict
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
CLIENT = "client"  # ConfigRecord of the reply: client-key, true-group (metrics only)

# custom query used once per client to learn its stable key before anything is sent to it
PROFILE_QUERY = "query.profile"

# a multi-model (IFCA) message: K models in ``arrays``, array ``name`` of model k under
# ``m{k}.{name}``, and ``config[CHOICES]`` = K; the client trains the one of lowest training
# loss, returns it under the plain names and reports its index as the metric ``CHOICE``
CHOICES = "ifca-k"
CHOICE = "ifca-choice"


def pack_models(models: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """K models in one dict, array names prefixed ``m{k}.``."""
    return {f"m{k}.{name}": value for k, model in enumerate(models) for name, value in model.items()}


def unpack_model(packed: Mapping[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Model k of a ``pack_models`` dict, under the plain names."""
    prefix = f"m{k}."
    return {name[len(prefix):]: value for name, value in packed.items() if name.startswith(prefix)}


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


@lru_cache(maxsize=512)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header ``np.save`` writes for a C-ordered array of this dtype and shape."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def encode_array(value: np.ndarray) -> Array:
    """``flwr.app.Array(ndarray)`` with the same bytes (a test checks), without ``np.save``'s
    per-call header formatting: the header is cached per dtype and shape."""
    array = np.ascontiguousarray(value)
    if array.dtype.hasobject or not array.dtype.isnative:
        return Array(array)
    shape = tuple(int(n) for n in array.shape)
    return Array(dtype=str(array.dtype), shape=shape, stype=NUMPY_STYPE,
                 data=_npy_header(str(array.dtype), shape) + array.tobytes())


def decode_array(array: Array) -> np.ndarray:
    """``array.numpy()``, reading the data directly when its header is the one ``np.save``
    writes for the Array's declared dtype and shape; anything else goes through ``np.load``."""
    if array.stype == NUMPY_STYPE:
        shape = tuple(array.shape)
        try:
            header = _npy_header(array.dtype, shape)
        except (TypeError, ValueError):
            header = None
        if header is not None and array.data.startswith(header):
            dtype = np.dtype(array.dtype)
            if len(array.data) - len(header) == dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
                return np.frombuffer(array.data, dtype=dtype, offset=len(header)).reshape(shape).copy()
    return array.numpy()


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: encode_array(value) for name, value in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: decode_array(array) for name, array in record.items()}


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
