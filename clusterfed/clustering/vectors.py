"""Update vectors of the bi-partitioning strategies (CFL, LayerCFL, HiCFL), pure NumPy: named
arrays flattened into one vector, stacked into a float64 matrix, cosines, the side of a split an
update belongs to (a newcomer's descent), and the criteria / check / similarity records of
clusters.json."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from itertools import combinations
from typing import Any

import numpy as np

from clusterfed.clustering.bipartition import SplitDecision, bipartition
from clusterfed.clustering.layercfl import CheckResult
from clusterfed.clustering.null_reference import reference_score, structure_threshold
from clusterfed.clustering.principal_scores import principal_scores
from clusterfed.clustering.sketch import Sketch, count_sketch, in_sketch_space
from clusterfed.clustering.split_rules import sides_silhouette
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix, split_silhouette

SIMILARITY_DECIMALS = 4  # similarity matrices in clusters.json are for figures
# a split's similarity matrix is recorded for at most this many of its clients (evenly
# spaced in key order): the figures read it, and all of it at 10,000 clients is 10^8 numbers
MAX_SIMILARITY_CLIENTS = 200


def flatten(arrays: Mapping[str, np.ndarray], names: list[str], dtype: Any = np.float64) -> np.ndarray:
    """The named arrays as one float64 vector, in ``names`` order; ``dtype=None``: in the
    arrays' own (common) dtype, for vectors kept between rounds (the float32 a client sent is
    half the memory of its float64 copy, and casting it when used gives the same numbers)."""
    return np.concatenate([np.asarray(arrays[n], dtype=dtype).ravel() for n in names])


def restrict_vectors(vectors: Mapping[Hashable, np.ndarray], names: list[str], kept: list[str],
                     shapes: Mapping[str, tuple[tuple[int, ...], Any]]) -> dict[Hashable, np.ndarray]:
    """Exact per-client vectors over ``names`` (``flatten`` order) cut to the arrays ``kept``, in
    ``kept`` order: when a choice narrows what is compared, each client keeps its earlier evidence
    on what is still compared (a member absent from a later split is placed by it). A vector of
    another length (taken over other arrays) is dropped; all are when ``kept`` is not within ``names``."""
    if not set(kept) <= set(names):
        return {}
    offsets, width = {}, 0
    for name in names:
        size = int(np.prod(shapes[name][0]))
        offsets[name], width = (width, width + size), width + size
    index = np.concatenate([np.arange(*offsets[name]) for name in kept])
    return {key: vector[index] for key, vector in vectors.items() if np.shape(vector)[-1] == width}


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


def closest_unmerged(server_round: int, updates: dict[int, np.ndarray], min_cosine: float,
                     drift: Callable[[int, int], float]) -> dict[str, Any] | None:
    """The pair of clusters (rows: their clients' vectors) whose mean vectors have the largest
    cosine, with the numbers of the merge tests: the silhouette of their members only when the
    cosine reached ``min_cosine`` (it costs a cosine matrix), and ``drift(a, b)`` (NaN: None)."""
    if len(updates) < 2:
        return None
    means = {c: u.mean(axis=0) for c, u in updates.items()}
    a, b = max(combinations(sorted(means), 2), key=lambda p: cosine(means[p[0]], means[p[1]]))
    record: dict[str, Any] = {"round": server_round, "clusters": [a, b], "cosine": cosine(means[a], means[b])}
    if record["cosine"] >= min_cosine and min(len(updates[a]), len(updates[b])) >= 2:
        size_a, size_b = len(updates[a]), len(updates[b])
        record["silhouette"] = sides_silhouette(np.vstack([updates[a], updates[b]]), np.arange(size_a),
                                                np.arange(size_a, size_a + size_b))
    found = drift(a, b)
    record["drift_cosine"] = None if np.isnan(found) else found
    return record


def required_structure(U: np.ndarray, structure: float, *, fixed: float, max_k: int, rank: int, draws: int,
                       seed: int) -> tuple[float, float | None]:
    """The best-cut silhouette a split of the rows of ``U`` needs (CFL's acceptance test): the
    ``fixed`` threshold, lowered to what group-free updates of this size and shape reach when the
    cut's ``structure`` falls short of it (``null_reference``, ``draws`` sets), and that reference
    score (None when not drawn). On ``rank`` > 0 principal components the reference is always
    drawn and is the threshold: the fixed one was set on raw cosines."""
    if (structure >= fixed and not rank) or draws <= 0:
        return fixed, None

    def score(R: np.ndarray) -> float:
        S = cosine_similarity_matrix(principal_scores(R, rank) if rank else R)
        return best_cut_silhouette(S, max_k)[0] if max_k > 2 else split_silhouette(S, *bipartition(S))

    reference = reference_score(U, score, draws=draws, seed=seed)
    if rank:
        return (fixed if reference is None else reference), reference
    return structure_threshold(fixed, reference), reference


def kept_vectors(last: Mapping[Hashable, np.ndarray], updates: Mapping[Hashable, Mapping[str, np.ndarray]],
                 names: list[str], decay: float, *, compact: bool, sketch: dict[str, Any] | None, sketch_dim: int,
                 seed: int) -> tuple[dict[Hashable, np.ndarray], dict[str, Any] | None]:
    """CFL's per-client vectors after a round: each updated client's update of ``names`` as sent
    (decay 0), or ``decay`` × its ``last`` vector + its update (a client's persistent pull grows
    with every round, its batch noise as the square root); ``compact``: in a float32 count sketch
    of ``sketch_dim`` numbers (whole, in float32, when not longer), whose spec ``sketch`` is made
    on first use (the map is linear: the sketch of the sum is the sum of sketches). Returns the
    new vectors and the sketch's spec."""
    out: dict[Hashable, np.ndarray] = {}
    if not compact:
        for key, update in updates.items():
            previous = last.get(key)
            if previous is None or decay == 0:
                out[key] = flatten(update, names, dtype=None)  # as sent (float32)
            else:
                out[key] = decay * previous + flatten(update, names)
        return out, sketch
    if not updates:
        return out, sketch
    if sketch is None:
        first = next(iter(updates.values()))
        made = count_sketch(int(sum(np.size(first[n]) for n in names)), sketch_dim, seed)
        sketch = None if made is None else made.spec
    mapped = Sketch.from_spec(sketch) if sketch is not None else None
    for key, update in updates.items():
        vector = flatten(update, names, dtype=np.float32)
        vector = mapped(vector) if mapped is not None else vector
        previous = last.get(key)
        out[key] = vector if previous is None or decay == 0 else (np.float32(decay) * previous + vector).astype(np.float32)
    return out, sketch
