"""HiCFL's per-layer model stability (Gong et al., "Towards Hierarchical Clustered Federated
Learning With Model Stability on Mobile Devices", steps 1–3 of ``hicfl.py``): the watched
layers, every reply's update of each of them fed to the ``StabilityTracker`` (on a seeded
sample of the layer's weights with ``update-storage = sketch``), the windowed stability of the
placed clients and the share of weights the ξ-selection keeps reported every round, and a
cluster's members' stability read in the unit ε is given in (absolute, the paper's, or
relative to each layer's scale at the cluster's first full window). Windows restart for
clients that change cluster (a split, a merge, a provisional member placed elsewhere)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from clusterfed.clustering.sketch import Sketch, split_budget
from clusterfed.clustering.split_rules import layer_scale, relative_stability
from clusterfed.clustering.stability import StabilityTracker
from clusterfed.strategies.exchange import Arrays, TrainReply
from clusterfed.strategies.parts import Host, Part
from clusterfed.strategies.update_vectors import flatten


class WindowState(Protocol):
    """The strategy state the stability windows live in (all read and written here but
    ``theta0``, read only): the tracker, the watched layers, their samples, ε and the scales."""

    theta0: Arrays
    tracker: StabilityTracker | None
    layer_keys: dict[str, list[str]]
    layers: list[str]
    layer_sizes: dict[str, int]
    samples: dict[str, dict[str, Any]]
    epsilon: float | None
    eps_rel: float
    scales: dict[int, dict[str, float]]
    windows_filled: bool


class StabilityWindows(Part[WindowState]):
    """The stability bookkeeping of HiCFL (module docstring); ``sketch_dim`` and ``seed`` size
    and seed the layers' samples under ``update-storage = sketch``."""

    def __init__(self, host: Host[WindowState], *, sketch_dim: int, seed: int) -> None:
        super().__init__(host)
        self.sketch_dim = sketch_dim
        self.seed = seed

    def watch(self, names: list[str]) -> None:
        """The layers whose stability is watched: ``names`` grouped by layer."""
        state = self.state
        state.layer_keys = {}
        for name in names:  # named layer = state-dict prefix: weight and bias together
            state.layer_keys.setdefault(name.rsplit(".", 1)[0], []).append(name)
        state.layers = list(state.layer_keys)
        state.layer_sizes = {layer: int(sum(state.theta0[n].size for n in keys))
                             for layer, keys in state.layer_keys.items()}

    def track(self, replies: list[TrainReply], compact: bool) -> None:
        """Feed every reply's update of each watched layer to the tracker (``compact``: on
        each layer's seeded sample)."""
        state = self.state
        if compact and not state.samples:
            # update-storage = sketch: every rule reads the same seeded sample of each layer's weights
            kept = split_budget(state.layer_sizes, self.sketch_dim)
            state.samples = {layer: Sketch("sample", size, kept[layer], self.seed).spec
                             for layer, size in state.layer_sizes.items() if kept[layer] < size}
        sampled = {layer: Sketch.from_spec(spec) for layer, spec in state.samples.items()}
        for reply in replies:
            update = reply.update
            for layer, keys in state.layer_keys.items():
                vector = flatten(update, keys, dtype=None)  # kept as sent
                state.tracker.add(reply.key, layer, sampled[layer](vector) if layer in sampled else vector)

    def sample_of(self, layer: str) -> dict[str, Any]:
        """A route's ``sketch`` entry: the layer's sample when the split was decided on one."""
        return {"sketch": self.state.samples[layer]} if layer in self.state.samples else {}

    def restart(self, keys: list[str]) -> None:
        """The windows and weight selections of ``keys`` start again (they changed cluster)."""
        self.state.tracker.reset(keys)

    def record(self, placed: list[str]) -> dict[str, Any]:
        """The round's stability diagnostics: ε, the ``placed`` clients' windowed stability per
        layer and the share of each layer's weights the ξ-selection keeps."""
        state = self.state
        tracker = state.tracker
        diagnostics: dict[str, Any] = {"stability_eps": state.epsilon}
        if state.epsilon is None:
            diagnostics["stability_eps_rel"] = state.eps_rel
            diagnostics["stability_scales"] = {str(c): dict(v) for c, v in state.scales.items()}
        diagnostics["stability"] = {k: {layer: tracker.windowed(k, layer) for layer in state.layers}
                                    for k in placed}
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

    def against_eps(self, cluster: int, members: list[str]) -> tuple[dict[str, dict | None], float]:
        """Per layer, the members' windowed stability in the unit ε is given in (absolute, or
        relative to the layer's scale, fixed at the cluster's first full window), and ε."""
        state = self.state
        windowed = {layer: {k: state.tracker.windowed(k, layer) for k in members} for layer in state.layers}
        if members and all(v is not None for w in windowed.values() for v in w.values()):
            state.windows_filled = True
        if state.epsilon is not None:
            return {layer: (None if any(v is None for v in w.values()) else w)
                    for layer, w in windowed.items()}, state.epsilon
        scales = state.scales.setdefault(cluster, {})
        out = {}
        for layer, w in windowed.items():
            if layer not in scales and (scale := layer_scale(w)) is not None:
                scales[layer] = scale
            out[layer] = relative_stability(w, scales.get(layer))
        return out, state.eps_rel
