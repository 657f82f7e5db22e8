"""Update vectors of the bi-partitioning strategies (CFL, LayerCFL, HiCFL), pure NumPy: named
arrays flattened into one vector, stacked into a float64 matrix, cosines, the side of a split an
update belongs to (a newcomer's descent), and the criteria / check / similarity records of
clusters.json."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from clusterfed.clustering.bipartition import SplitDecision
from clusterfed.clustering.layercfl import CheckResult
from clusterfed.clustering.sketch import in_sketch_space

SIMILARITY_DECIMALS = 4  # similarity matrices in clusters.json are for figures
# a split's similarity matrix is recorded for at most this many of its clients (evenly
# spaced in key order): the figures read it, and all of it at 10,000 clients is 10^8 numbers
MAX_SIMILARITY_CLIENTS = 200


def flatten(arrays: Mapping[str, np.ndarray], names: list[str], dtype: Any = np.float64) -> np.ndarray:
    """The named arrays as one float64 vector, in ``names`` order; ``dtype=None``: in the
    arrays' own (common) dtype, for vectors kept between rounds (the float32 a client sent is
    half the memory of its float64 copy, and casting it when used gives the same numbers)."""
    return np.concatenate([np.asarray(arrays[n], dtype=dtype).ravel() for n in names])


def stack_float64(vectors: list[np.ndarray]) -> np.ndarray:
    """``np.stack`` of the vectors cast to float64, filled row by row: the same matrix without
    a float64 copy of every row alive beside it (half the memory at thousands of clients)."""
    out = np.empty((len(vectors), np.size(vectors[0]) if vectors else 0), np.float64)
    for i, vector in enumerate(vectors):
        out[i] = vector
    return out


def cosine(u: np.ndarray, v: np.ndarray) -> float:
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    return 0.0 if nu == 0.0 or nv == 0.0 else float(np.dot(u, v) / (nu * nv))


def side_of(vector: np.ndarray, route: dict[str, Any]) -> int:
    """0 or 1: the side of a split that an update on ``route["names"]`` belongs to: mapped by
    the split's sketch if it was decided on sketches, minus the split round's mean update if
    the split was centred (HiCFL), then the side whose mean it is nearest to by cosine or,
    for the reference rule, the reference's side iff their cosine is positive."""
    vector = in_sketch_space(vector, route.get("sketch"))
    if route.get("centre") is not None:
        vector = vector - route["centre"]
    sims = [cosine(vector, d) for d in route["directions"]]
    if route["rule"] == "reference":
        return 0 if sims[0] > 0 else 1
    return int(np.argmax(sims))  # nearest side mean; ties -> side 0


def decision_record(decision: SplitDecision) -> dict[str, Any]:
    return {
        "mode": decision.mode,
        "mean_norm": decision.mean_norm,
        "max_norm": decision.max_norm,
        "reference_mean_norm": decision.reference_mean_norm,
        "stationary": decision.stationary,
        "heterogeneous": decision.heterogeneous,
    }


def check_record(check: CheckResult) -> dict[str, Any]:
    return {"passed": check.passed, "alpha_cross_max": check.alpha_cross_max, "gamma_max": check.gamma_max,
            "bound": check.bound}


def similarity_record(keys: list[str], S: np.ndarray) -> dict[str, Any]:
    """A split's similarity matrix for figures: of at most ``MAX_SIMILARITY_CLIENTS``
    clients, evenly spaced in key order (``clients``: how many the split compared)."""
    if len(keys) > MAX_SIMILARITY_CLIENTS:
        shown = np.unique(np.linspace(0, len(keys) - 1, MAX_SIMILARITY_CLIENTS).round().astype(int))
        return {"keys": [keys[i] for i in shown], "matrix": np.round(S[np.ix_(shown, shown)], SIMILARITY_DECIMALS).tolist(),
                "clients": len(keys)}
    return {"keys": list(keys), "matrix": np.round(S, SIMILARITY_DECIMALS).tolist()}
