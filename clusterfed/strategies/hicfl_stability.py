"""HiCFL's per-layer model stability and split proposals (Gong et al., steps 2–5 of
``hicfl.py``), as functions of HiCFL's ``State``: the watched layers (``watch``), every reply's
update of each fed to the ``StabilityTracker`` (``track``; on a seeded sample of each layer with
``update-storage = sketch``), a cluster's members' stability in the unit ε is given in
(``against_eps``: absolute, the paper's, or relative to each layer's scale at the cluster's
first full window), windows restarted for clients that change cluster (``restart``), and a
proposal per ready layer (``propose``; the math in ``clustering/layer_split.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.clustering.layer_split import (EVIDENCE_DRAWS, EvidenceTest, evidence_reference, propose_split,
                                               small_side_reference)
from clusterfed.clustering.null_reference import shared_draws
from clusterfed.clustering.sketch import Sketch, split_budget
from clusterfed.clustering.split_rules import layer_scale, relative_stability
from clusterfed.clustering.vectors import flatten, stack_float64
from clusterfed.core.exchange import ClientInfo, TrainReply
from clusterfed.models.layers import weight_unit_of


# ------------------------------------------------------------ steps 2–3: stability, weight selection
def watch(state: Any, names: list[str]) -> None:
    """The layers whose stability is watched: ``names`` grouped by layer."""
    state.layer_keys = {}
    for name in names:  # named layer = state-dict prefix, weight and bias together; a recurrent
        # layer's input and hidden weights (weight_ih_l0, weight_hh_l0) each a layer with its bias
        state.layer_keys.setdefault(weight_unit_of(name, names), []).append(name)
    state.layers = list(state.layer_keys)
    state.layer_sizes = {layer: int(sum(state.theta0[n].size for n in keys)) for layer, keys in state.layer_keys.items()}


def watched_names(state: Any) -> list[str]:
    """Every watched array, layer by layer."""
    return [n for layer in state.layers for n in state.layer_keys[layer]]


def chosen_layers(state: Any) -> list[str]:
    """The layers that propose a split on evidence: every watched layer, or with an array chosen
    (``decision-arrays``) the layer holding it."""
    chosen = set(state.chosen_arrays)
    return [layer for layer in state.layers if not chosen or chosen & set(state.layer_keys[layer])]


def reproduction_rows(state: Any, replies: list[TrainReply]) -> tuple[np.ndarray, np.ndarray | None]:
    """What a split's partition is reproduced on: every watched array, or the array chosen
    (``decision-arrays``), with every watched array for whether its parts point apart (None: the same)."""
    names = watched_names(state)
    chosen = list(state.chosen_arrays) or names
    rows = stack_float64([flatten(r.update, chosen) for r in replies])
    return rows, None if chosen == names else stack_float64([flatten(r.update, names) for r in replies])


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
    structure score (``clustering/layer_split.py``), or None."""
    tracker = state.tracker
    # split-timing = evidence proposes before the windows fill: an unknown stability ranks last
    stability = {k: float("inf") if (v := tracker.windowed(k, layer)) is None else float(v) for k in members}
    weights = {k: clients[k].num_examples for k in members} if params.split != "linkage" else None
    found = propose_split(members, {k: tracker.last_update(k, layer) for k in members}, stability, weights,
                          rule=params.split, min_side=params.min_side, max_k=params.split_silhouette_max_k,
                          centre=params.centre_updates)
    if found is None:
        return None
    route = {"rule": found["rule"], "names": state.layer_keys[layer], "directions": found["directions"],
             "centre": found["centre"], **sample_of(state, layer)}
    return {"layer": layer, "keys": found["keys"], "score": found["score"], "S": found["S"], "stability": stability,
            "route": route, "record": found["record"]}


def small_side_test(state: Any, params: Any, proposal: dict[str, Any], members: list[str], cluster_size: int,
                    evidence: bool = False, tests: int = 1) -> EvidenceTest:
    """The test against group-free rotations a split must pass (``layer_split``): a split into a
    small side (``small``); on evidence any larger split too (``group_free``). ``members``: the
    compared clients; ``cluster_size``: how many members the cluster has; ``tests``: how many
    layers the proposal was chosen among, whose tests share one level (``shared_draws``)."""
    if params.split != "linkage" or (params.small_side_reference_draws <= 0 and not evidence):
        return EvidenceTest("")
    U = np.stack([state.tracker.last_update(k, proposal["layer"]) for k in members])
    smallest = min(len(side) for side in proposal["keys"])
    if not evidence:
        return EvidenceTest("small", small_side_reference(
            U, smallest, rule=params.split, draws=params.small_side_reference_draws,
            min_split_size=params.min_split_size, max_k=params.split_silhouette_max_k, seed=params.seed))
    return evidence_reference(U, smallest, rule=params.split, small_draws=params.small_side_reference_draws,
                              min_split_size=params.min_split_size, max_k=params.split_silhouette_max_k,
                              seed=params.seed, members=cluster_size, draws=shared_draws(EVIDENCE_DRAWS, tests))
