"""Numbers of the protocol: the layout of a reply's arrays as one vector, quantization, masks.

A member's vector is ``[w, c, w*q_1, ..., w*q_d]`` over the integers modulo a power of two:
``w`` its integer weight, ``c`` how many of its values were clipped, ``q`` its values quantized
to ``{0, ..., T}`` over ``[-R, R]`` by unbiased stochastic rounding. The group's sum of these
gives the total weight, the total clipped and ``sum w*q``, from which the weighted mean is
``sum(w*q) / W * 2R/T - R`` (``dequantize``): each member's rounding error is below one step,
so the mean is off by less than ``2R/T`` per value (values inside ``[-R, R]``).

Masks are expanded from 32-byte seeds with AES-256 in counter mode (the ``cryptography``
package Flower itself uses), after HKDF-SHA256 with a label of their own (see the package
docstring for why not Flower's ``pseudo_rand_gen``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

HEADER = 2  # the weight and the clipped count lead the vector
_MASK_LABEL = b"clusterfed.secagg mask v1"

# one entry per array: (record name, array name, dtype, shape)
Layout = list[tuple[str, str, str, tuple[int, ...]]]


def wire_dtype(modulus_bits: int) -> np.dtype:
    return np.dtype(np.uint32) if modulus_bits <= 32 else np.dtype(np.uint64)


def reduce(vector: np.ndarray, modulus_bits: int) -> np.ndarray:
    """``vector`` modulo 2**bits, in place where it can (uint64 arithmetic wraps modulo 2**64)."""
    if modulus_bits < 64:
        np.bitwise_and(vector, np.uint64((1 << modulus_bits) - 1), out=vector)
    return vector


def layout_of(records: Mapping[str, Mapping[str, np.ndarray]]) -> Layout:
    """The arrays in a fixed order: records, then arrays, as they came (the reply's own order)."""
    return [(record, name, str(np.asarray(value).dtype), tuple(np.shape(value)))
            for record, arrays in records.items() for name, value in arrays.items()]


def layout_size(layout: Layout) -> int:
    return int(sum(int(np.prod(shape, dtype=np.int64)) for *_, shape in layout))


def layout_to_text(layout: Layout) -> str:
    return json.dumps([[record, name, dtype, list(shape)] for record, name, dtype, shape in layout])


def layout_from_text(text: str) -> Layout:
    entries = json.loads(text)
    return [(str(record), str(name), str(np.dtype(dtype)), tuple(int(n) for n in shape))
            for record, name, dtype, shape in entries]


def flatten(records: Mapping[str, Mapping[str, np.ndarray]], layout: Layout) -> np.ndarray:
    parts = [np.asarray(records[record][name], dtype=np.float64).ravel() for record, name, _, _ in layout]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, layout: Layout) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    start = 0
    for record, name, _, shape in layout:
        size = int(np.prod(shape, dtype=np.int64))
        out.setdefault(record, {})[name] = vector[start:start + size].reshape(shape)
        start += size
    return out


def quantize(values: np.ndarray, clipping_range: float, levels: int,
             rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(values in ``{0..levels}`` as uint64, how many were clipped): ``values`` clipped to
    ``[-R, R]``, scaled to ``[0, levels]`` and rounded up with probability equal to the
    fraction (unbiased). ``rng`` is the mod's own generator, never NumPy's global one."""
    clipped = int(np.count_nonzero(np.abs(values) > clipping_range))
    scaled = (np.clip(values, -clipping_range, clipping_range) + clipping_range) * (levels / (2 * clipping_range))
    floor = np.floor(scaled)
    rounded = floor + (rng.random(scaled.shape) < (scaled - floor))
    return np.clip(rounded, 0, levels).astype(np.uint64), clipped


def dequantize(summed: np.ndarray, total_weight: int, clipping_range: float, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(weighted sum, weighted mean) as float64 from ``sum w*q`` and ``W = sum w``."""
    step = 2 * clipping_range / levels
    total = summed.astype(np.float64) * step - clipping_range * total_weight
    mean = total / total_weight if total_weight else np.full(summed.shape, np.nan)
    return total, mean


def mask_key(shared_key: bytes) -> bytes:
    """The 32-byte seed of a pairwise mask from Flower's ``generate_shared_key`` (url-safe base64)."""
    return base64.urlsafe_b64decode(shared_key)


def mask(seed: bytes, length: int, modulus_bits: int) -> np.ndarray:
    """``length`` integers uniform modulo 2**bits expanded from a 32-byte ``seed``."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_MASK_LABEL).derive(seed)
    encryptor = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
    stream = encryptor.update(bytes(8 * length)) + encryptor.finalize()
    return reduce(np.frombuffer(stream, dtype=np.uint64).copy(), modulus_bits)
