"""HiCFL model stability (Gong, Xing, Liu, Xi and Chen, "Towards Hierarchical Clustered
Federated Learning With Model Stability on Mobile Devices", IEEE TMC 2023).

Per client and layer, from the last three (selected) updates Δ_{t−2}, Δ_{t−1}, Δ_t:

    T_t       = cos(Δ_{t−1}, Δ_t)        T_{t−1} = cos(Δ_{t−2}, Δ_{t−1})
    T_{t−2~t} = cos(Δ_{t−2}, Δ_t)        S_t     = |(T_t + T_{t−1})/2 − T_{t−2~t}|

averaged over a sliding window of W rounds. A cluster is bi-partitioned when some layer has
windowed S < ε for every member; the member with the smallest S is the reference and every
member whose update points the same way (cos > 0) joins its side.
``centred_reference_split`` is the same rule on the updates minus their (sample-weighted)
mean — a deviation from the paper (its eq. 18 uses raw updates), documented in
strategies/hicfl.py: the shared component every update carries otherwise decides the sign.

Pure NumPy. Client keys and layer names are any hashables.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


def _cos(u: np.ndarray, v: np.ndarray) -> float:
    """Cosine similarity; 0.0 when either vector is zero (no direction, no trend)."""
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    if nu == 0.0 or nv == 0.0:
        return 0.0
    return float(np.clip(np.dot(u, v) / (nu * nv), -1.0, 1.0))


def _flat(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def _index(idx: np.ndarray, size: int | None) -> np.ndarray:
    """A kept selection in the smallest index type the layer needs: uint16 up to 65,536
    weights, int32 up to 2**31 (a quarter / half the memory of int64; it picks the same
    weights in the same order)."""
    if size is not None and size <= 2**16 and (idx.size == 0 or int(idx.max()) < 2**16):
        return idx.astype(np.uint16)
    if size is not None and size < 2**31 and (idx.size == 0 or int(idx.max()) < 2**31):
        return idx.astype(np.int32)
    return idx


def _kept(x: np.ndarray) -> np.ndarray:
    """A vector to keep between rounds: float16/float32 in its own dtype, copied (float32 as
    clients send it: half the memory of float64, and every use casts it with ``_flat``, giving
    the same numbers), anything else as float64 (``_flat``)."""
    x = np.asarray(x)
    return x.ravel().copy() if x.dtype in (np.float16, np.float32) else _flat(x)


def stability_score(d_tm2: np.ndarray, d_tm1: np.ndarray, d_t: np.ndarray) -> float:
    """HiCFL model stability S_t of three consecutive updates (eq. 12–14); in [0, 2].

    Small S: the update direction drifts steadily (or not at all). Zero vectors count as
    cosine 0 with anything, so S stays finite.
    """
    a, b, c = _flat(d_tm2), _flat(d_tm1), _flat(d_t)
    if not (a.size == b.size == c.size):
        raise ValueError(f"updates differ in size: {a.size}, {b.size}, {c.size}")
    t_now = _cos(b, c)  # T_t
    t_prev = _cos(a, b)  # T_{t−1}
    t_span = _cos(a, c)  # T_{t−2~t}
    return abs((t_now + t_prev) / 2.0 - t_span)


# --------------------------------------------------------------------------- weight selection


def select_unstable_weights(
    d_new: np.ndarray, d_old: np.ndarray, xi: float, min_kept: int = 1
) -> np.ndarray:
    """Indexes d with |Δ_new[d] − Δ_old[d]| > ξ (HiCFL eq. 19; we read it as the
    absolute value of the change), sorted int64.

    Never empty: if fewer than ``min_kept`` (default 1) weights moved by more than ξ the
    layer has no usable set of "unstable" weights to single out, so all indexes are kept
    (the stability of the whole layer is used). Why a floor above 1 can matter: on a
    single weight every cosine is ±1 and S is identically 0, so that client looks
    perfectly stable and becomes every split's reference.
    """
    new, old = _flat(d_new), _flat(d_old)
    if new.size != old.size:
        raise ValueError(f"updates differ in size: {new.size} vs {old.size}")
    idx = np.flatnonzero(np.abs(new - old) > xi)
    if idx.size < max(int(min_kept), 1):
        idx = np.arange(new.size)
    return idx.astype(np.int64)


def fraction_kept(indexes: np.ndarray | None, size: int) -> float:
    """Share of a layer's ``size`` weights kept by a selection (``None``: all kept)."""
    if size <= 0:
        return 1.0
    if indexes is None:
        return 1.0
    return float(np.asarray(indexes).size) / float(size)


# --------------------------------------------------------------------------- tracker


@dataclass
class _LayerState:
    selection: np.ndarray | None = None  # indexes used for stability, None = all
    size: int | None = None  # full length of this layer's update
    history: deque = field(default_factory=lambda: deque(maxlen=3))  # selected updates
    scores: deque | None = None  # last W stability values
    last_full: np.ndarray | None = None  # previous unselected update (for selection)


class StabilityTracker:
    """Per (client key, layer): the last three selected updates and the last W scores.

    ``window`` = W. ``xi``: if given, weight selection runs automatically — the first update
    a (key, layer) receives while it has no selection is compared with the previous full
    update (kept across ``reset``) and the indexes with |Δ_new − Δ_old| > ξ become its
    selection; with no previous update yet that round only records the update. If ``xi``
    is None, stability uses all weights unless ``set_selection`` was called.
    ``min_kept_fraction``: an automatic selection keeping fewer than this share of the
    layer's weights falls back to all of them (``select_unstable_weights``'s ``min_kept``).

    ``windowed`` answers None until the window holds W scores: a split decision should rest
    on a full window, as in the paper (a partial mean of one or two noisy scores would let a
    cluster split too early).
    """

    def __init__(self, window: int = 5, xi: float | None = None, min_kept_fraction: float = 0.0) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not 0.0 <= min_kept_fraction <= 1.0:
            raise ValueError(f"min_kept_fraction must be in [0, 1], got {min_kept_fraction}")
        self.window = int(window)
        self.xi = xi
        self.min_kept_fraction = float(min_kept_fraction)  # selections smaller than this keep all
        self._state: dict[tuple[Hashable, Hashable], _LayerState] = {}

    def _get(self, key: Hashable, layer: Hashable) -> _LayerState:
        st = self._state.get((key, layer))
        if st is None:
            st = _LayerState(scores=deque(maxlen=self.window))
            self._state[(key, layer)] = st
        return st

    def _restart(self, st: _LayerState) -> None:
        st.history.clear()
        st.scores.clear()

    def add(self, key: Hashable, layer: Hashable, update_vector: np.ndarray) -> float | None:
        """Record this round's update of one layer; returns the new S_t, or None if fewer
        than three selected updates are held yet."""
        v = _kept(update_vector)
        st = self._get(key, layer)
        if st.size is not None and st.size != v.size:
            raise ValueError(
                f"client {key!r} layer {layer!r}: update size {v.size}, expected {st.size}"
            )
        st.size = v.size
        previous, st.last_full = st.last_full, v

        if st.selection is None and self.xi is not None:
            if previous is None:
                return None  # selection needs two updates; start next round
            min_kept = int(np.ceil(self.min_kept_fraction * v.size))
            st.selection = _index(select_unstable_weights(v, previous, self.xi, min_kept=min_kept), v.size)
            self._restart(st)

        st.history.append(v if st.selection is None else v[st.selection])
        if len(st.history) < 3:
            return None
        score = stability_score(*st.history)
        st.scores.append(score)
        return score

    def set_selection(self, key: Hashable, layer: Hashable, idx: np.ndarray | None) -> None:
        """Use only ``idx`` of this layer for stability (None: all weights). The history and
        window restart, since earlier vectors were taken on other coordinates."""
        st = self._get(key, layer)
        st.selection = None if idx is None else _index(np.asarray(idx, dtype=np.int64).ravel(), st.size)
        self._restart(st)

    def selection(self, key: Hashable, layer: Hashable) -> np.ndarray | None:
        st = self._state.get((key, layer))
        return None if st is None or st.selection is None else st.selection.astype(np.int64)

    def kept_fraction(self, key: Hashable, layer: Hashable) -> float | None:
        """Fraction of the layer's weights used for stability; None if never seen or not
        selected yet while automatic selection is pending."""
        st = self._state.get((key, layer))
        if st is None or st.size is None:
            return None
        if st.selection is None and self.xi is not None:
            return None
        return fraction_kept(st.selection, st.size)

    def last_update(self, key: Hashable, layer: Hashable) -> np.ndarray | None:
        """The previous full (unselected) update of this layer, for manual selection."""
        st = self._state.get((key, layer))
        return None if st is None or st.last_full is None else _flat(st.last_full)

    def scores(self, key: Hashable, layer: Hashable) -> list[float]:
        """The stability values currently in the window (oldest first)."""
        st = self._state.get((key, layer))
        return [] if st is None else list(st.scores)

    def windowed(self, key: Hashable, layer: Hashable) -> float | None:
        """Mean S over the window once it holds W values, else None."""
        st = self._state.get((key, layer))
        if st is None or len(st.scores) < self.window:
            return None
        return float(np.mean(st.scores))

    def reset(self, keys: Iterable[Hashable]) -> None:
        """After a split: the members' histories and windows restart on every layer, and
        their weight selection is dropped so it is redone on entering the new cluster
        (HiCFL §IV-C). The last full update is kept so automatic selection can run on the
        very next update."""
        wanted = set(keys)
        for (key, _layer), st in self._state.items():
            if key in wanted:
                self._restart(st)
                st.selection = None

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Drop all state of these clients (e.g. clients that left)."""
        wanted = set(keys)
        for k in [k for k in self._state if k[0] in wanted]:
            del self._state[k]


# --------------------------------------------------------------------------- split timing / sides


def cluster_ready_to_split(
    tracker: StabilityTracker,
    member_keys: Sequence[Hashable],
    layers: Sequence[Hashable],
    epsilon: float,
) -> Hashable | None:
    """First layer (in ``layers`` order) whose windowed S is < ε for every member, all
    windows full; None if there is none (or no members)."""
    members = list(member_keys)
    if not members:
        return None
    for layer in layers:
        ok = True
        for key in members:
            s = tracker.windowed(key, layer)
            if s is None or not s < epsilon:
                ok = False
                break
        if ok:
            return layer
    return None


def reference_split(
    updates_by_key: Mapping[Hashable, np.ndarray],
    stability_by_key: Mapping[Hashable, float],
) -> tuple[list, list] | None:
    """HiCFL reference-based bi-partition (eq. 17–18).

    Reference c_r = argmin S (ties: the first in ``updates_by_key`` order). A client joins
    the reference's side iff cos(Δ_r, Δ_j) > 0 (the reference itself is on it). Returns
    (reference side keys, other side keys) in input order, or None when every client
    points the reference's way — a split never leaves an empty side.
    """
    keys = list(updates_by_key)
    if len(keys) < 2:
        return None
    missing = [k for k in keys if k not in stability_by_key]
    if missing:
        raise ValueError(f"no stability value for clients {missing}")
    scores = [float(stability_by_key[k]) for k in keys]
    ref = keys[int(np.argmin(scores))]
    ref_vec = _flat(updates_by_key[ref])
    ref_side, other = [], []
    for k in keys:
        if k == ref or _cos(ref_vec, _flat(updates_by_key[k])) > 0.0:
            ref_side.append(k)
        else:
            other.append(k)
    if not other:
        return None
    return ref_side, other


def centred_updates(
    updates_by_key: Mapping[Hashable, np.ndarray],
    weights_by_key: Mapping[Hashable, float] | None = None,
) -> dict:
    """Each update minus the members' (weighted) mean update, Δ_c − Σ_j w_j Δ_j / Σ_j w_j.

    ``weights_by_key``: sample counts n_c (None or all zero: equal weights). The mean is the
    direction every member shares — the cluster's own progress — and carries no
    information about which sub-group a member belongs to.
    """
    keys = list(updates_by_key)
    if not keys:
        return {}
    U = np.stack([_flat(updates_by_key[k]) for k in keys])
    w = np.ones(len(keys)) if weights_by_key is None else np.array([float(weights_by_key[k]) for k in keys])
    if w.sum() <= 0:
        w = np.ones(len(keys))
    mean = (w[:, None] * U).sum(axis=0) / w.sum()
    return {k: U[i] - mean for i, k in enumerate(keys)}


def centred_reference_split(
    updates_by_key: Mapping[Hashable, np.ndarray],
    stability_by_key: Mapping[Hashable, float],
    weights_by_key: Mapping[Hashable, float] | None = None,
) -> tuple[list, list] | None:
    """``reference_split`` on the centred updates (``centred_updates``): the reference is
    still argmin S; a member joins its side iff cos(Δ_r − Δ̄, Δ_j − Δ̄) > 0.

    Why: early in training every member's update holds a large common component (the
    shared model's progress), so cos(Δ_r, Δ_j) > 0 for nearly everyone and the sign of the
    raw cosine splits off only the few clients whose group pulls hardest against it.
    Removing the mean leaves the group-specific parts, whose signs relative to the
    reference's separate the groups (two groups: exactly the two sides).
    """
    return reference_split(centred_updates(updates_by_key, weights_by_key), stability_by_key)
