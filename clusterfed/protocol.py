"""The message contract between the server and client apps (docs/message-contract.md), in one place.

Record keys, the config keys a client needs to build its data and model, array
conversion and byte counting. Both apps import this; nothing here trains or clusters.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

NUMPY_STYPE = "numpy.ndarray"  # flwr's SType.NUMPY: Array.data holds the .npy file bytes

# record names inside a message's RecordDict
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
CLIENT = "client"  # ConfigRecord of the reply: client-key, true-group (metrics only)

# the profile probe: an evaluate message whose config has phase = PROFILE_PHASE and which
# carries the initial model. A clusterfed client answers with its profile (client record with
# CAPABILITIES_KEY, training-set size); a stock ClientApp evaluates the model, so it answers
# without an error (and without a traceback in Flower's log)
PROFILE_PHASE = "profile"
CAPABILITIES_KEY = "capabilities"  # in the profile's client record: what the client can do
# beside it: "<capability>: how to give it", for each capability the client's task lacks
CAPABILITIES_MISSING_KEY = "capabilities-missing"
# the query servers before the probe sent; clusterfed clients still answer it
PROFILE_QUERY = "query.profile"

# a multi-model (IFCA) message: K models in ``arrays``, array ``name`` of model k under
# ``m{k}.{name}``, and ``config[CHOICES]`` = K; the client trains the one of lowest training
# loss, returns it under the plain names and reports its index as the metric ``CHOICE``
CHOICES = "ifca-k"
CHOICE = "ifca-choice"
# a multi-model train message whose config has phase = CHOOSE_PHASE asks only for the choice:
# the client trains nothing and returns no arrays, only CHOICE and the chosen model's
# train-loss (IFCA's choice step under secure aggregation, which then sums each choice's trainers)
CHOOSE_PHASE = "choose"


def pack_models(models: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """K models in one dict, array names prefixed ``m{k}.``."""
    return {f"m{k}.{name}": value for k, model in enumerate(models) for name, value in model.items()}


def unpack_model(packed: Mapping[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Model k of a ``pack_models`` dict, under the plain names."""
    prefix = f"m{k}."
    return {name[len(prefix):]: value for name, value in packed.items() if name.startswith(prefix)}


def difference(trained: np.ndarray, sent: np.ndarray) -> np.ndarray:
    """The update ``trained - sent`` in the arrays' dtype; for bool arrays, which numpy
    cannot subtract, ``trained XOR sent`` (integers wrap, so ``apply_difference`` restores
    ``trained`` exactly in every integer and bool dtype)."""
    # np.asarray: numpy turns the difference of two 0-d arrays into a scalar
    return np.asarray(np.logical_xor(trained, sent) if np.asarray(sent).dtype == np.bool_ else trained - sent)


def apply_difference(sent: np.ndarray, update: np.ndarray) -> np.ndarray:
    """``sent + update``, the inverse of ``difference`` (XOR for bool arrays)."""
    return np.asarray(np.logical_xor(sent, update) if np.asarray(sent).dtype == np.bool_ else sent + update)


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
    "fault-attackers",
    "fault-attack",
    "fault-attack-factor",
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


@lru_cache(maxsize=512)
def _encoding(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype name, shape of Python ints, .npy header) of an array: what every message of a
    model repeats, worked out once (``str(dtype)`` alone costs microseconds)."""
    name = str(dtype)
    shape = tuple(int(n) for n in shape)
    return name, shape, _npy_header(name, shape)


@lru_cache(maxsize=512)
def _decoding(dtype: str, shape: tuple[int, ...]) -> tuple[np.dtype, bytes, int] | None:
    """(dtype, .npy header, payload bytes) an Array of this declared dtype and shape has when
    ``np.save`` wrote it, or None for a declaration numpy cannot read."""
    try:
        header = _npy_header(dtype, shape)
        numpy_dtype = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    return numpy_dtype, header, numpy_dtype.itemsize * math.prod(shape)


def _fields_only_array() -> bool:
    """True when Flower's ``Array`` keeps exactly its four fields and a dirty flag in its
    ``__dict__`` (Flower 1.41): then an Array can be made without its constructor's argument
    parsing (a third of an encode). Anything else takes the constructor."""
    try:
        probe = Array(dtype="float32", shape=(1,), stype=NUMPY_STYPE, data=b"\0\0\0\0")
        return vars(probe) == {"dtype": "float32", "shape": (1,), "stype": NUMPY_STYPE, "data": b"\0\0\0\0",
                               "_is_dirty": True}
    except Exception:  # noqa: BLE001 - any other Array: the constructor
        return False


_FIELDS_ONLY_ARRAY = _fields_only_array()


def _array(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    if not _FIELDS_ONLY_ARRAY:
        return Array(dtype=dtype, shape=shape, stype=NUMPY_STYPE, data=data)
    array = Array.__new__(Array)
    array.__dict__.update(dtype=dtype, shape=shape, stype=NUMPY_STYPE, data=data, _is_dirty=True)
    return array


def encode_array(value: np.ndarray) -> Array:
    """``flwr.app.Array(ndarray)`` with the same bytes (a test checks), without ``np.save``'s
    per-call header formatting: the header is cached per dtype and shape."""
    # order="C", not np.ascontiguousarray, which turns a 0-d array into shape (1,)
    array = np.asarray(value, order="C")
    if array.dtype.hasobject or not array.dtype.isnative:
        return Array(array)
    dtype, shape, header = _encoding(array.dtype, array.shape)
    # bytes + a buffer copies the array's memory once (tobytes() first would copy it twice)
    return _array(dtype, shape, header + memoryview(array.reshape(-1).view(np.uint8)))


def decode_array(array: Array, copy: bool = True) -> np.ndarray:
    """``array.numpy()``, reading the data directly when its header is the one ``np.save``
    writes for the Array's declared dtype and shape; anything else goes through ``np.load``.
    ``copy=False``: a read-only view of the Array's bytes where it can be (for a caller that
    only reads it, e.g. to load it into a model)."""
    if array.stype == NUMPY_STYPE:
        shape = tuple(array.shape)
        known = _decoding(array.dtype, shape)
        if known is not None:
            dtype, header, nbytes = known
            data = array.data
            if len(data) - len(header) == nbytes and data.startswith(header):
                view = np.frombuffer(data, dtype=dtype, offset=len(header)).reshape(shape)
                return view.copy() if copy else view
    return array.numpy()


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    # set item by item: ``ArrayRecord(dict_of_arrays)`` would build every Array a second time
    record = ArrayRecord()
    for name, value in arrays.items():
        record[name] = encode_array(value)
    return record


def from_array_record(record: ArrayRecord, copy: bool = True) -> dict[str, np.ndarray]:
    """The record's arrays by name; ``copy=False``: read-only views where they can be."""
    return {name: decode_array(array, copy) for name, array in record.items()}


def array_bytes(record: ArrayRecord | None) -> int:
    """Payload bytes of the arrays in a record: the sum of each array's ``nbytes``."""
    if record is None:
        return 0
    return sum(math.prod(array.shape) * _itemsize(array.dtype) for array in record.values())


@lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def message_array_bytes(content: RecordDict) -> int:
    # the records themselves, not ``content.array_records`` (a view built on every access)
    return sum(array_bytes(record) for record in content.values() if isinstance(record, ArrayRecord))


def parse_upload(value: str) -> list[str] | None:
    """``full`` -> None (everything), else the comma-separated array names."""
    if value == UPLOAD_FULL:
        return None
    return [name for name in value.split(",") if name]


def upload_names(names: Iterable[str]) -> str:
    """The ``upload`` value that asks a client for exactly ``names`` (``parse_upload``'s
    inverse): the names joined by commas. ValueError for no name, or a name that is empty,
    holds a comma or is ``full``, which the value could not carry."""
    names = list(names)
    bad = [name for name in names if not name or "," in name or name == UPLOAD_FULL]
    if not names or bad:
        raise ValueError(f"upload needs one or more array names without commas (not {UPLOAD_FULL!r}); got {names!r}")
    return ",".join(names)


def config_record(values: Mapping[str, object]) -> ConfigRecord:
    return ConfigRecord({k: v for k, v in values.items() if v is not None})


# ------------------------------------------------------------- evidence without the bytes
# A clustering ask may say "project these arrays' updates": ``config[EVIDENCE_SKETCH]`` =
# "name:size,name:size" and ``config[EVIDENCE_SEED]`` = the map's seed. The client returns, for
# each named array, its update (trained - received) flattened, projected to ``size`` numbers by
# the shared seeded CountSketch (the whole update when it has no more numbers than that) and
# encoded as 4-bit numbers behind a float32 scale (uint8; ``clustering.evidence_sketch.project``),
# under the array's own name.
EVIDENCE_SKETCH = "evidence-sketch"
EVIDENCE_SEED = "evidence-seed"


def evidence_config(sizes: Mapping[str, int], seed: int) -> dict[str, object]:
    """The config keys that ask for ``sizes`` (array -> numbers kept) projected with ``seed``
    (``{}`` for none)."""
    if not sizes:
        return {}
    bad = [name for name in sizes if not name or "," in name]
    if bad:
        raise ValueError(f"evidence-sketch cannot name arrays {bad!r}")
    return {EVIDENCE_SKETCH: ",".join(f"{name}:{int(size)}" for name, size in sizes.items()),
            EVIDENCE_SEED: int(seed)}


def parse_evidence(config: Mapping[str, object]) -> tuple[dict[str, int], int] | None:
    """(array -> numbers kept, seed) of an ask that asks for projected updates, else None."""
    value = config.get(EVIDENCE_SKETCH)
    if not value:
        return None
    sizes = {}
    for item in str(value).split(","):
        name, sep, size = item.rpartition(":")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise ValueError(f"{EVIDENCE_SKETCH}={value!r}: write it as name:size,name:size")
        sizes[name] = int(size)
    return sizes, int(config.get(EVIDENCE_SEED, 0))


def project_evidence(trained: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray],
                     config: Mapping[str, object]) -> dict[str, np.ndarray]:
    """What a client returns for an ask with ``EVIDENCE_SKETCH``: each named array's update,
    projected (``clustering.evidence_sketch.project``)."""
    from clusterfed.clustering.evidence_sketch import project  # scipy: only where it is asked

    sizes, seed = parse_evidence(config)  # type: ignore[misc]
    unknown = [name for name in sizes if name not in trained or name not in received]
    if unknown:
        raise ValueError(f"{EVIDENCE_SKETCH} asks for arrays this model does not have: {unknown}")
    return {name: project(difference(trained[name], received[name]), name, size, seed)
            for name, size in sizes.items()}


def evidence_shapes(config: Mapping[str, object], shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]]
                    ) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """The (shape, dtype) of each array a reply to an evidence ask carries (the uint8 bytes of
    ``min(size, numbers)`` encoded numbers), or None when ``config`` asks for no projection."""
    from clusterfed.clustering.evidence_sketch import SKETCH_DTYPE, encoded_bytes

    parsed = parse_evidence(config)
    if parsed is None:
        return None
    sizes, _ = parsed
    return {name: ((encoded_bytes(min(size, math.prod(shapes[name][0]))),), np.dtype(SKETCH_DTYPE))
            for name, size in sizes.items() if name in shapes}


def is_projected(arrays: Mapping[str, np.ndarray], projected: Mapping[str, tuple[tuple[int, ...], np.dtype]],
                 shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> bool:
    """Whether a reply's ``arrays`` are the projection an evidence ask asked for (``projected``,
    from ``evidence_shapes``) rather than whole arrays of the model (``shapes``): the same
    names, every array of its projected shape, and one at least of a shape the model's differs
    from (an ask projects at least one array, or it asks for none)."""
    return (set(arrays) == set(projected)
            and all(tuple(np.shape(arrays[n])) == tuple(projected[n][0]) and np.asarray(arrays[n]).dtype == projected[n][1]
                    for n in projected)
            and any(projected[n] != tuple(shapes[n]) for n in projected))
