"""HiCFL's per-layer model stability and split proposals (Gong et al., "Towards Hierarchical
Clustered Federated Learning With Model Stability on Mobile Devices", steps 2–5 of
``hicfl.py``), as functions of HiCFL's ``State``:

- the watched layers (``watch``), every reply's update of each fed to the ``StabilityTracker``
  (``track``; on a seeded sample of the layer's weights with ``update-storage = sketch``), the
  round's windowed stability and the share of weights the ξ-selection keeps (``record``), a
  cluster's members' stability in the unit ε is given in (``against_eps``: absolute, the
  paper's, or relative to each layer's scale at the cluster's first full window); windows
  restart for clients that change cluster (``restart``);
- on one layer, a bi-partition of the members by the configured rule (``propose``: the paper's
  sign of the cosine with the reference member's update, optionally centred, or complete
  linkage) with its structure score, and the score of group-free rotations a split leaving a
  small side must beat (``small_side_reference``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.null_reference import reference_score
from clusterfed.clustering.sketch import Sketch, split_budget
from clusterfed.clustering.split_rules import layer_scale, relative_stability, sides_silhouette
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix
from clusterfed.clustering.stability import centred_updates, reference_split
from clusterfed.clustering.vectors import cosine, flatten
from clusterfed.strategies.exchange import ClientInfo, TrainReply


# ------------------------------------------------------------ steps 2–3: stability, weight selection
def watch(state: Any, names: list[str]) -> None:
    """The layers whose stability is watched: ``names`` grouped by layer."""
    state.layer_keys = {}
    for name in names:  # named layer = state-dict prefix: weight and bias together
        state.layer_keys.setdefault(name.rsplit(".", 1)[0], []).append(name)
    state.layers = list(state.layer_keys)
    state.layer_sizes = {layer: int(sum(state.theta0[n].size for n in keys)) for layer, keys in state.layer_keys.items()}


def track(state: Any, replies: list[TrainReply], compact: bool, sketch_dim: int, seed: int) -> None:
    """Feed every reply's update of each watched layer to the tracker (``compact``: on each
    layer's seeded sample of ``sketch_dim`` weights in all)."""
    if compact and not state.samples:
        # update-storage = sketch: every rule reads the same seeded sample of each layer's weights
        kept = split_budget(state.layer_sizes, sketch_dim)
        state.samples = {layer: Sketch("sample", size, kept[layer], seed).spec
                         for layer, size in state.layer_sizes.items() if kept[layer] < size}
    sampled = {layer: Sketch.from_spec(spec) for layer, spec in state.samples.items()}
    for reply in replies:
        update = reply.update
        for layer, keys in state.layer_keys.items():
            vector = flatten(update, keys, dtype=None)  # kept as sent
            state.tracker.add(reply.key, layer, sampled[layer](vector) if layer in sampled else vector)


def sample_of(state: Any, layer: str) -> dict[str, Any]:
    """A route's ``sketch`` entry: the layer's sample when the split was decided on one."""
    return {"sketch": state.samples[layer]} if layer in state.samples else {}


def restart(state: Any, cluster: int, keys: list[str]) -> None:
    """The windows and weight selections of ``keys`` start again (they entered ``cluster``)."""
    state.tracker.reset(keys)


def record(state: Any, placed: list[str]) -> dict[str, Any]:
    """The round's stability diagnostics: ε, the ``placed`` clients' windowed stability per
    layer and the share of each layer's weights the ξ-selection keeps."""
    tracker = state.tracker
    diagnostics: dict[str, Any] = {"stability_eps": state.epsilon}
    if state.epsilon is None:
        diagnostics["stability_eps_rel"] = state.eps_rel
        diagnostics["stability_scales"] = {str(c): dict(v) for c, v in state.scales.items()}
    diagnostics["stability"] = {k: {layer: tracker.windowed(k, layer) for layer in state.layers} for k in placed}
    kept_by_layer, kept_total, size_total = {}, 0.0, 0
    for layer in state.layers:
        fractions = [f for k in placed if (f := tracker.kept_fraction(k, layer)) is not None]
        kept_by_layer[layer] = float(np.mean(fractions)) if fractions else None
        if fractions:
            kept_total += float(np.sum(fractions)) * state.layer_sizes[layer]
            size_total += len(fractions) * state.layer_sizes[layer]
    diagnostics["weights_kept"] = kept_by_layer
    diagnostics["weights_kept_total"] = kept_total / size_total if size_total else None
    return diagnostics


# ------------------------------------------------------------ step 4: timing
def against_eps(state: Any, cluster: int, members: list[str]) -> tuple[dict[str, dict | None], float]:
    """Per layer, the members' windowed stability in the unit ε is given in (absolute, or
    relative to the layer's scale, fixed at the cluster's first full window), and ε."""
    windowed = {layer: {k: state.tracker.windowed(k, layer) for k in members} for layer in state.layers}
    if members and all(v is not None for w in windowed.values() for v in w.values()):
        state.windows_filled = True
    if state.epsilon is not None:
        return {layer: (None if any(v is None for v in w.values()) else w) for layer, w in windowed.items()}, state.epsilon
    scales = state.scales.setdefault(cluster, {})
    out = {}
    for layer, w in windowed.items():
        if layer not in scales and (scale := layer_scale(w)) is not None:
            scales[layer] = scale
        out[layer] = relative_stability(w, scales.get(layer))
    return out, state.eps_rel


def note_timing(state: Any, params: Any, server_round: int, cluster: int, values: dict[str, dict | None],
                eps: float) -> None:
    """Keep the layer whose stability (every member's largest or the median, ``timing``) came
    nearest ε (``last_timing``, for the run's explanation)."""
    statistic = np.max if params.timing == "all" else np.median
    judged = {layer: float(statistic(list(v.values()))) for layer, v in values.items() if v}
    if judged:
        layer = min(judged, key=judged.get)
        state.last_timing = {"round": server_round, "cluster": cluster, "layer": layer, "value": judged[layer],
                             "eps": eps}


# ------------------------------------------------------------ step 5: proposals
def propose(state: Any, params: Any, clients: dict[str, ClientInfo], layer: str,
            members: list[str]) -> dict[str, Any] | None:
    """The bi-partition of ``members`` on ``layer`` by the configured rule (``split``) and its
    structure score, or None when the reference rule puts everyone on one side."""
    tracker, layer_keys = state.tracker, state.layer_keys
    raw = {k: tracker.last_update(k, layer) for k in members}
    U = np.stack([raw[k] for k in members])
    S = cosine_similarity_matrix(U)  # raw: comparable with CFL's
    stability = {k: float(tracker.windowed(k, layer)) for k in members}
    if params.split == "linkage":
        side_a, side_b = bipartition(S)
        if min(len(side_a), len(side_b)) < params.min_side:
            return None  # one outlier client is not a group (hicfl-min-side)
        keys_a, keys_b = [members[i] for i in side_a], [members[i] for i in side_b]
        max_k = params.split_silhouette_max_k
        score = float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(U, side_a, side_b)
        route = {"rule": "nearest-mean", "names": layer_keys[layer],
                 "directions": [U[side_a].mean(axis=0), U[side_b].mean(axis=0)], "centre": None,
                 **sample_of(state, layer)}
        return {"layer": layer, "keys": (keys_a, keys_b), "score": score, "S": S, "stability": stability,
                "route": route, "record": {"rule": "linkage"}}
    # the paper: reference c_r = argmin S; cos(Δ_r, Δ_j) > 0 joins its side
    centre = params.centre_updates
    weights = {k: clients[k].num_examples for k in members}
    updates = centred_updates(raw, weights) if centre else raw
    sides = reference_split(updates, stability)
    if sides is None:
        return None
    keys_a, keys_b = sides
    position = {k: i for i, k in enumerate(members)}
    reference = min(members, key=lambda k: stability[k])  # reference_split's argmin (first on ties)
    score = sides_silhouette(U, [position[k] for k in keys_a], [position[k] for k in keys_b])
    route = {"rule": "reference", "names": layer_keys[layer], "directions": [updates[reference]],
             "centre": raw[reference] - updates[reference] if centre else None, **sample_of(state, layer)}
    entry = {"rule": "reference", "reference": reference, "centred": centre,
             "centred_similarity_to_reference": {k: round(cosine(updates[reference], updates[k]), 4) for k in members}}
    return {"layer": layer, "keys": sides, "score": score, "S": S, "stability": stability, "route": route,
            "record": entry}


def small_side_reference(state: Any, params: Any, proposal: dict[str, Any], members: list[str]) -> float | None:
    """The best-cut silhouette a linkage split leaving a side of 2 to ``min-split-size`` − 1
    members must beat: the largest over ``small-side-reference-draws`` rotation-test draws of
    the members' updates of the proposal's layer (``null_reference``). None when both sides are
    larger, a side is one client, for the reference rule, or with draws = 0. Noise split into
    small sides reaches the fixed ``min-silhouette`` easily (a 2 | 2 cut of 4 noisy updates
    scores about 0.5); where one direction dominates (two clear groups) the rotations keep it."""
    draws = params.small_side_reference_draws
    smallest = min(len(side) for side in proposal["keys"])
    # a one-member side is an outlier that min-side = 1 asked for: rotations cannot judge it
    if draws <= 0 or params.split != "linkage" or smallest >= params.min_split_size or smallest < 2:
        return None
    layer = proposal["layer"]
    U = np.stack([state.tracker.last_update(k, layer) for k in members]).astype(np.float64)
    max_k = params.split_silhouette_max_k

    def score(R: np.ndarray) -> float:
        S = cosine_similarity_matrix(R)
        return float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(R, *bipartition(S))

    return reference_score(U, score, draws=draws, seed=params.seed, method="rotation")
