"""Compact stand-ins for clients' update vectors kept between rounds.

A clustered strategy that compares clients' updates keeps one vector per client (or
several) between rounds; at thousands of clients the full vectors dominate the server's
memory. Two seeded linear maps shorten them, both the same for every client so that
the shortened vectors stay comparable:

- ``CountSketch`` (cosine and dot products only): coordinate ``i`` is added, with a random
  sign ``s_i``, to one of ``size`` buckets ``h_i`` — a sparse Johnson–Lindenstrauss
  transform with one ±1 per input coordinate (Charikar, Chen and Farach-Colton, "Finding
  frequent items in data streams", ICALP 2002; Weinberger et al., "Feature hashing for large
  scale multitask learning", ICML 2009). ``E⟨Pu, Pv⟩ = ⟨u, v⟩``, and a cosine is kept to
  about ``1/sqrt(size)`` for vectors whose mass is spread over many coordinates (as a
  network's update is). Chosen over a dense Gaussian projection (a ``size × d`` matrix: 137
  million numbers for a 33,580-weight model at 4,096 dimensions) and over scikit-learn's
  ``SparseRandomProjection`` (``sqrt(d)``-times more non-zeros per coordinate, so that
  many more operations per update, with a matrix to hold) because it costs one pass over
  the update and its map is two small arrays drawn from a bit stream whose values NumPy
  keeps stable across releases (a checkpoint resumes with the same map).
- ``CoordinateSample``: a seeded subset of ``size`` coordinates, for rules that read
  coordinates themselves (HiCFL's weight selection ``|Δ_new[d] − Δ_old[d]| > ξ``).

Both are plain data (``spec`` dicts: kind, dim, size, seed) so that checkpoints and route
records carry them; the arrays behind them are rebuilt on demand and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import scipy.sparse


def _raw_bits(dim: int, seed: int, salt: int) -> np.ndarray:
    """``dim`` 64-bit words from PCG64 seeded with (seed, salt, dim): raw bit streams of a
    NumPy BitGenerator are stable across releases (unlike the Generator's distributions)."""
    return np.random.PCG64(np.random.SeedSequence([int(seed), int(salt), int(dim)])).random_raw(int(dim))


@lru_cache(maxsize=32)
def _count_sketch_matrix(dim: int, size: int, seed: int) -> scipy.sparse.csr_matrix:
    bits = _raw_bits(dim, seed, 1)
    buckets = ((bits >> np.uint64(32)) % np.uint64(size)).astype(np.int64)
    signs = np.where(bits & np.uint64(1), 1.0, -1.0)
    return scipy.sparse.csr_matrix((signs, (np.arange(dim), buckets)), shape=(dim, size))


@lru_cache(maxsize=64)
def _sample_indexes(dim: int, size: int, seed: int) -> np.ndarray:
    order = np.argsort(_raw_bits(dim, seed, 2), kind="stable")
    indexes = np.sort(order[:size])
    indexes.setflags(write=False)
    return indexes


@dataclass(frozen=True)
class Sketch:
    """A seeded linear map from ``dim`` numbers to ``size`` float32 numbers (``kind``:
    ``count`` = ``CountSketch``, ``sample`` = ``CoordinateSample``; module docstring)."""

    kind: str
    dim: int
    size: int
    seed: int

    def __post_init__(self) -> None:
        if self.kind not in ("count", "sample"):
            raise ValueError(f"unknown sketch kind {self.kind!r}; expected 'count' or 'sample'")
        if not 0 < self.size <= self.dim:
            raise ValueError(f"sketch size must be in 1..{self.dim} (the vector's length), got {self.size}")

    @property
    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "size": self.size, "seed": self.seed}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "Sketch":
        return cls(str(spec["kind"]), int(spec["dim"]), int(spec["size"]), int(spec["seed"]))

    @property
    def indexes(self) -> np.ndarray:
        """``sample``: the kept coordinates, ascending."""
        return _sample_indexes(self.dim, self.size, self.seed)

    def __call__(self, vector: np.ndarray) -> np.ndarray:
        """The sketch of one vector of ``dim`` numbers (or of each row of a matrix), float32."""
        x = np.asarray(vector)
        if x.shape[-1] != self.dim:
            raise ValueError(f"sketch of {self.dim} numbers given a vector of {x.shape[-1]}")
        if self.kind == "sample":
            return np.asarray(x[..., self.indexes], dtype=np.float32)
        out = np.asarray(x.astype(np.float64, copy=False) @ _count_sketch_matrix(self.dim, self.size, self.seed))
        return out.astype(np.float32)


def count_sketch(dim: int, size: int, seed: int) -> Sketch | None:
    """A ``CountSketch`` to ``size`` numbers, or None when the vector is no longer than that
    (kept whole)."""
    return Sketch("count", dim, size, seed) if dim > size else None


def split_budget(sizes: dict[str, int], budget: int) -> dict[str, int]:
    """Numbers kept per layer when ``budget`` is shared among layers of ``sizes``: equal
    shares, a layer smaller than its share keeps all of it and leaves the rest to the
    larger ones (water filling). Every layer keeps at least one number."""
    out: dict[str, int] = {}
    left = max(int(budget), len(sizes))
    order = sorted(sizes, key=lambda name: sizes[name])
    for i, name in enumerate(order):
        share = left // (len(order) - i)
        out[name] = max(1, min(sizes[name], share))
        left -= out[name]
    return {name: out[name] for name in sizes}


def in_sketch_space(vector: np.ndarray, spec: dict[str, Any] | None) -> np.ndarray:
    """``vector`` in the space of a sketch ``spec``: mapped when it has the sketch's input
    length, as it is when it already has the output length (or when ``spec`` is None)."""
    if spec is None:
        return vector
    x = np.asarray(vector)
    if x.shape[-1] == int(spec["dim"]) and int(spec["dim"]) != int(spec["size"]):
        return Sketch.from_spec(spec)(x)
    return x
