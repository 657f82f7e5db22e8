"""The clustering round's evidence without the bytes: each uploaded array's update (its change
from the start model) projected by a seeded CountSketch the server and the client share.

FedClust's and AdaCFL's clustering round compares the clients' updates of one layer; when the
layer is chosen by evidence (``cluster-layers = auto``) every candidate layer is uploaded once,
which on a small model is the whole model. Projected, the round uploads at most the *paper
layer's* bytes (the layer the strategy's paper compares: FedClust's final layer, AdaCFL's
smallest fully connected one), whatever the model: the budget is shared equally among the
candidate layers (a layer smaller than its share keeps all of it, water filling) and, within a
layer, among its arrays the same way.

The map is ``clustering.sketch.Sketch("count", ...)`` (a sparse Johnson–Lindenstrauss transform,
one ±1 per coordinate; its buckets and signs come from a NumPy bit stream that is stable across
releases), one per array, seeded by the run's seed and the array's name (``array_seed``): a
client and the server build the same map from the ask's config alone. It is linear, so
``E‖Pu‖² = ‖u‖²`` and ``E⟨Pu, Pv⟩ = ⟨u, v⟩``: L2 distances and cosines between the clients'
updates are kept, with a relative error of about ``sqrt(2 / k)`` for ``k`` numbers kept per
array (``cosine_error_bound``; measured on real updates: benchmarks/results/evidence-bytes).
An array no larger than its share is sent whole (flattened).

Each projected array travels as 4-bit numbers (``encode``: a float32 scale, three root-mean-
squares, then two numbers a byte, clipped to it and rounded to 15 levels): for the same bytes, 8 times the
numbers of a float32 projection, so the projection's error (which falls as ``1/sqrt(k)``) is
``sqrt(8)`` times smaller, while the rounding adds a relative variance of about 1–2 % per
number (measured: the quickstart test's weak groups were lost at float32 and kept at 4 bits).

Plain data: a plan is ``{"seed": int, "sizes": {array: numbers kept}, "budget_bytes": int}``
(checkpointed in the strategy's state); ``{}`` = no projection (the upload is within budget).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clusterfed.clustering.sketch import Sketch, split_budget

SKETCH_DTYPE = np.uint8  # what a projected array travels as: ``encode``'s bytes
LEVELS = 7  # 4-bit numbers: -7..7 times scale / 7
CLIP = 3.0  # the scale: this many root-mean-squares of the numbers encoded
_SCALE_BYTES = 4  # the float32 scale in front


def encoded_bytes(k: int) -> int:
    """Bytes of ``k`` numbers encoded: the scale and two 4-bit numbers a byte."""
    return _SCALE_BYTES + (int(k) + 1) // 2


def encode(values: np.ndarray) -> np.ndarray:
    """``values`` as bytes: a scale (float32: ``CLIP`` root-mean-squares, at most the largest
    magnitude), then each number clipped to it and rounded to one of 15 levels, two 4-bit
    numbers a byte."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    # CLIP root-mean-squares (or the largest magnitude, if smaller): a heavy-tailed update
    # (a few large entries) would otherwise round its bulk to zero; the few beyond are clipped
    rms = float(np.sqrt(np.mean(x * x))) if x.size else 0.0
    scale = np.float32(min(np.max(np.abs(x), initial=0.0), CLIP * rms))
    q = np.zeros(x.size, np.uint8) if scale == 0 else (
        np.clip(np.rint(x / float(scale) * LEVELS), -LEVELS, LEVELS) + LEVELS).astype(np.uint8)
    if q.size % 2:
        q = np.append(q, np.uint8(LEVELS))
    packed = (q[0::2] << 4) | q[1::2]
    return np.concatenate([np.frombuffer(scale.tobytes(), np.uint8), packed.astype(np.uint8)])


def decode(data: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` numbers ``encode`` wrote (float64)."""
    data = np.asarray(data, dtype=np.uint8).reshape(-1)
    if data.size != encoded_bytes(k):
        raise ValueError(f"{data.size} bytes do not encode {k} numbers ({encoded_bytes(k)} bytes)")
    scale = float(np.frombuffer(data[:_SCALE_BYTES].tobytes(), np.float32)[0])
    packed = data[_SCALE_BYTES:]
    q = np.empty(packed.size * 2, np.float64)
    q[0::2], q[1::2] = packed >> 4, packed & 0x0F
    return (q[:k] - LEVELS) * (scale / LEVELS)


def array_seed(seed: int, name: str) -> int:
    """The seed of array ``name``'s map: the run's seed and a CRC-32 of the name (stable
    everywhere; arrays of the same length get independent maps)."""
    return ((int(seed) & 0xFFFFFFFF) << 32) | zlib.crc32(str(name).encode())


def kept(dim: int, size: int) -> int:
    """Numbers a projected array of ``dim`` numbers travels as: ``size``, or all of it."""
    return min(int(size), int(dim))


def sketch(update: np.ndarray, name: str, size: int, seed: int) -> np.ndarray:
    """Array ``name``'s update, flattened and projected to ``size`` numbers (float64; whole,
    flattened, when it has no more than that)."""
    flat = np.asarray(update, dtype=np.float64).reshape(-1)
    if flat.size <= int(size):
        return flat
    return Sketch("count", int(flat.size), int(size), array_seed(seed, name))(flat).astype(np.float64)


def project(update: np.ndarray, name: str, size: int, seed: int) -> np.ndarray:
    """What a client sends for array ``name``: its update projected (``sketch``) and encoded
    (``encode``, uint8)."""
    return encode(sketch(update, name, size, seed))


def plan(shapes: Mapping[str, tuple[Sequence[int], Any]], layers: Mapping[str, Sequence[str]],
         budget_bytes: int, seed: int) -> dict[str, Any]:
    """The projection of the arrays of ``layers`` (layer -> array names; ``shapes``: name ->
    (shape, dtype)) within ``budget_bytes``: ``{}`` when they fit as they are, else the numbers
    each array keeps (equal shares per layer, then per array, water filling)."""
    names = [name for keys in layers.values() for name in keys]
    full = sum(math.prod(shapes[n][0]) * np.dtype(shapes[n][1]).itemsize for n in names)
    if not names or full <= budget_bytes:
        return {}
    # numbers: two a byte, less each array's scale and its odd half byte
    budget = max(2 * (int(budget_bytes) - (_SCALE_BYTES + 1) * len(names)), len(names))
    layer_sizes = {layer: sum(math.prod(shapes[n][0]) for n in keys) for layer, keys in layers.items() if keys}
    shares = split_budget(layer_sizes, budget)
    sizes: dict[str, int] = {}
    for layer, share in shares.items():
        sizes.update(split_budget({n: math.prod(shapes[n][0]) for n in layers[layer]}, share))
    # every array keeps at least one number: with more arrays than numbers, the largest give way
    while sum(sizes.values()) > budget and max(sizes.values()) > 1:
        largest = max(sizes, key=lambda n: sizes[n])
        sizes[largest] -= min(sum(sizes.values()) - budget, sizes[largest] - 1)
    if sum(encoded_bytes(kept(math.prod(shapes[n][0]), k)) for n, k in sizes.items()) > budget_bytes:
        return {}  # more arrays than the budget has bytes for a scale each: sent as they are
    return {"seed": int(seed), "sizes": sizes, "dims": {n: int(math.prod(shapes[n][0])) for n in sizes},
            "budget_bytes": int(budget_bytes)}


def plan_bytes(plan_: Mapping[str, Any], names: Sequence[str] | None = None) -> int:
    """Bytes a client uploads under ``plan_`` for ``names`` (default: every planned array)."""
    sizes, dims = plan_.get("sizes", {}), plan_.get("dims", {})
    return sum(encoded_bytes(kept(dims.get(n, sizes[n]), sizes[n])) for n in (sizes if names is None else names)
               if n in sizes)


def cosine_error_bound(size: int) -> float:
    """The typical (one standard deviation) error of a cosine between two updates projected
    to ``size`` numbers by a CountSketch, for updates whose mass is spread over many
    coordinates: ``sqrt(2 / size)`` (the JL variance of an inner product of unit vectors is at
    most ``2 / size``)."""
    return math.sqrt(2.0 / max(int(size), 1))


def in_space(update: np.ndarray, name: str, dim: int, plan_: Mapping[str, Any]) -> np.ndarray:
    """Array ``name``'s update in the plan's space, float64: decoded when the client projected
    it (``encode``'s bytes), projected and encoded here, the same numbers, when it arrived
    whole (``dim`` numbers: a stock ClientApp returns its whole model). ValueError otherwise."""
    update = np.asarray(update)
    size = int(plan_["sizes"][name])
    out = kept(dim, size)
    if update.dtype == SKETCH_DTYPE and update.size == encoded_bytes(out):
        return decode(update, out)
    if update.size == dim:
        return decode(project(update, name, size, int(plan_["seed"])), out)
    raise ValueError(f"{name}: {update.size} numbers are neither the array ({dim}) nor its projection "
                     f"({encoded_bytes(out)} bytes)")


def updates_in_space(updates: Sequence[Mapping[str, np.ndarray]], start: Mapping[str, np.ndarray],
                     names: Sequence[str], plan_: Mapping[str, Any]) -> tuple[list[dict[str, np.ndarray]],
                                                                                dict[str, np.ndarray]]:
    """Each client's updates of ``names`` in the plan's space (``in_space``), and the origin of
    that space (zeros): what a rows builder that subtracts a start model takes."""
    dims = {n: int(np.asarray(start[n]).size) for n in names}
    rows = [{n: in_space(u[n], n, dims[n], plan_) for n in names} for u in updates]
    origin = {n: np.zeros(kept(dims[n], plan_["sizes"][n])) for n in names}
    return rows, origin
