"""HiCFL's per-layer model stability (Gong et al., steps 1–3 of ``hicfl.py``): every reply's
update of each watched layer feeds the ``StabilityTracker`` (on a seeded sample of the layer's
weights with ``update-storage = sketch``), the windowed stability of the placed clients and the
share of weights the ξ-selection keeps are reported every round, and a cluster's members'
stability is read in the unit ε is given in (absolute, the paper's, or relative to each
layer's scale at the cluster's first full window). Windows restart for clients that change
cluster (a split, a merge, a provisional member placed elsewhere)."""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.clustering.sketch import Sketch, split_budget
from clusterfed.clustering.split_rules import layer_scale, relative_stability
from clusterfed.strategies.exchange import TrainReply
from clusterfed.strategies.update_vectors import flatten


class StabilityWindows:
    """The stability bookkeeping of ``HiCFL`` (reads its tracker, layers, samples and scales)."""

    def track(self, replies: list[TrainReply]) -> None:
        """Feed every reply's update of each watched layer to the tracker."""
        if self.compact_storage() and not self.samples:
            # update-storage = sketch: every rule reads the same seeded sample of each layer's weights
            kept = split_budget(self.layer_sizes, self.params.sketch_dim)
            self.samples = {layer: Sketch("sample", size, kept[layer], self.params.seed).spec
                            for layer, size in self.layer_sizes.items() if kept[layer] < size}
        sampled = {layer: Sketch.from_spec(spec) for layer, spec in self.samples.items()}
        for reply in replies:
            update = reply.update
            for layer, keys in self.layer_keys.items():
                vector = flatten(update, keys, dtype=None)  # kept as sent
                self.tracker.add(reply.key, layer, sampled[layer](vector) if layer in sampled else vector)

    def sample_of(self, layer: str) -> dict[str, Any]:
        """A route's ``sketch`` entry: the layer's sample when the split was decided on one."""
        return {"sketch": self.samples[layer]} if layer in self.samples else {}

    def record_stability(self) -> dict[str, Any]:
        """The round's stability diagnostics: ε, the members' windowed stability per layer and
        the share of each layer's weights the ξ-selection keeps."""
        placed = self.placed()
        diagnostics: dict[str, Any] = {"stability_eps": self.epsilon}
        if self.epsilon is None:
            diagnostics["stability_eps_rel"] = self.eps_rel
            diagnostics["stability_scales"] = {str(c): dict(v) for c, v in self.scales.items()}
        diagnostics["stability"] = {k: {layer: self.tracker.windowed(k, layer) for layer in self.layers}
                                    for k in placed}
        kept_by_layer, kept_total, size_total = {}, 0.0, 0
        for layer in self.layers:
            fractions = [f for k in placed if (f := self.tracker.kept_fraction(k, layer)) is not None]
            kept_by_layer[layer] = float(np.mean(fractions)) if fractions else None
            if fractions:
                kept_total += float(np.sum(fractions)) * self.layer_sizes[layer]
                size_total += len(fractions) * self.layer_sizes[layer]
        diagnostics["weights_kept"] = kept_by_layer
        diagnostics["weights_kept_total"] = kept_total / size_total if size_total else None
        return diagnostics

    def stability_against_eps(self, cluster: int, members: list[str]) -> tuple[dict[str, dict | None], float]:
        """Per layer, the members' windowed stability in the unit ε is given in (absolute, or
        relative to the layer's scale, fixed at the cluster's first full window), and ε."""
        windowed = {layer: {k: self.tracker.windowed(k, layer) for k in members} for layer in self.layers}
        if members and all(v is not None for w in windowed.values() for v in w.values()):
            self.windows_filled = True
        if self.epsilon is not None:
            return {layer: (None if any(v is None for v in w.values()) else w)
                    for layer, w in windowed.items()}, self.epsilon
        scales = self.scales.setdefault(cluster, {})
        out = {}
        for layer, w in windowed.items():
            if layer not in scales and (scale := layer_scale(w)) is not None:
                scales[layer] = scale
            out[layer] = relative_stability(w, scales.get(layer))
        return out, self.eps_rel

    def after_merge(self, cluster: int, keys: list[str]) -> None:
        self.tracker.reset(keys)  # as after a split: the merged cluster's windows restart

    def entered(self, cluster: int, keys: list[str]) -> None:
        self.tracker.reset(keys)  # a provisional member placed elsewhere: its windows restart
