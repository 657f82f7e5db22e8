"""HiCFL's split proposals (Gong et al., "Towards Hierarchical Clustered Federated Learning With
Model Stability on Mobile Devices", step 4 of ``hicfl.py``): on one layer, a bi-partition of the
members by the configured rule (``split``: complete linkage of the cosine similarities, or the
paper's sign of the cosine with the reference member's centred update) with its structure
score, and the score of group-free rotations of the updates that a split leaving a small side
must beat (``small-side-reference-draws``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.null_reference import reference_score
from clusterfed.clustering.split_rules import sides_silhouette
from clusterfed.clustering.split_scores import best_cut_silhouette, cosine_similarity_matrix
from clusterfed.clustering.stability import StabilityTracker, centred_updates, reference_split
from clusterfed.strategies.exchange import ClientInfo
from clusterfed.strategies.parts import Host, Part
from clusterfed.strategies.update_vectors import cosine


class ProposalParams(Protocol):
    """HiCFL's parameters the proposals read (``HiCFLParams`` has them; a Protocol, not an
    import of the module that composes this part)."""

    split: str
    min_side: int
    min_split_size: int
    split_silhouette_max_k: int
    small_side_reference_draws: int
    centre_updates: bool
    seed: int


class ProposalState(Protocol):
    """The strategy state the proposals read (all of it read only): the tracker's latest
    updates and windowed stability, the watched layers' arrays."""

    tracker: StabilityTracker | None
    layer_keys: dict[str, list[str]]


class ProposalHost(Host[ProposalState], Protocol):
    """What the proposals need of HiCFL beyond its state: its clients' sizes (centring)."""

    clients: dict[str, ClientInfo]


class LayerProposals(Part[ProposalState]):
    """The proposals of HiCFL (module docstring); ``sample_of(layer)``: the route's ``sketch``
    entry when the layer's updates are kept on a sample (``StabilityWindows.sample_of``)."""

    def __init__(self, host: ProposalHost, params: ProposalParams, sample_of: Callable[[str], dict[str, Any]]) -> None:
        super().__init__(host)
        self.host: ProposalHost = host
        self.params = params
        self.sample_of = sample_of

    def propose(self, layer: str, members: list[str]) -> dict[str, Any] | None:
        """The bi-partition of ``members`` on ``layer`` by the configured rule (``split``)
        and its structure score, or None when the reference rule puts everyone on one side."""
        tracker, layer_keys = self.state.tracker, self.state.layer_keys
        raw = {k: tracker.last_update(k, layer) for k in members}
        U = np.stack([raw[k] for k in members])
        S = cosine_similarity_matrix(U)  # raw: comparable with CFL's
        stability = {k: float(tracker.windowed(k, layer)) for k in members}
        if self.params.split == "linkage":
            side_a, side_b = bipartition(S)
            if min(len(side_a), len(side_b)) < self.params.min_side:
                return None  # one outlier client is not a group (hicfl-min-side)
            keys_a, keys_b = [members[i] for i in side_a], [members[i] for i in side_b]
            max_k = self.params.split_silhouette_max_k
            score = float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(U, side_a, side_b)
            route = {"rule": "nearest-mean", "names": layer_keys[layer],
                     "directions": [U[side_a].mean(axis=0), U[side_b].mean(axis=0)], "centre": None,
                     **self.sample_of(layer)}
            return {"layer": layer, "keys": (keys_a, keys_b), "score": score, "S": S, "stability": stability,
                    "route": route, "record": {"rule": "linkage"}}
        centre = self.params.centre_updates
        weights = {k: self.host.clients[k].num_examples for k in members}
        updates = centred_updates(raw, weights) if centre else raw
        sides = reference_split(updates, stability)
        if sides is None:
            return None
        keys_a, keys_b = sides
        position = {k: i for i, k in enumerate(members)}
        reference = min(members, key=lambda k: stability[k])  # reference_split's argmin (first on ties)
        score = sides_silhouette(U, [position[k] for k in keys_a], [position[k] for k in keys_b])
        route = {"rule": "reference", "names": layer_keys[layer], "directions": [updates[reference]],
                 "centre": raw[reference] - updates[reference] if centre else None,
                 **self.sample_of(layer)}
        record = {"rule": "reference", "reference": reference, "centred": centre,
                  "centred_similarity_to_reference": {k: round(cosine(updates[reference], updates[k]), 4)
                                                      for k in members}}
        return {"layer": layer, "keys": sides, "score": score, "S": S, "stability": stability, "route": route,
                "record": record}

    def small_side_reference(self, proposal: dict[str, Any], members: list[str]) -> float | None:
        """The best-cut silhouette a linkage split leaving a side of fewer than
        ``min-split-size`` members must beat: the largest over ``small-side-reference-draws``
        rotation-test draws of the members' updates of the proposal's layer
        (``null_reference``, exact for Gaussian noise of any covariance). None when both
        sides are larger, when a side is one client (``min-side`` = 1 allows such outliers), for
        the reference rule, or with draws = 0. Noise split into small
        sides reaches the fixed ``min-silhouette`` easily (a 2 | 2 cut of 4 noisy updates
        scores about 0.5); the rotations score what such noise reaches. Only small sides are
        tested: where one direction dominates the updates (two clear groups) the rotations
        keep it and score as high as the real cut."""
        draws = self.params.small_side_reference_draws
        smallest = min(len(side) for side in proposal["keys"])
        # a one-member side is an outlier that min-side = 1 asked for; the rotations spread
        # one outlier's deviation over every row and score higher than it, so they cannot judge it
        if draws <= 0 or self.params.split != "linkage" or smallest >= self.params.min_split_size or smallest < 2:
            return None
        layer = proposal["layer"]
        U = np.stack([self.state.tracker.last_update(k, layer) for k in members]).astype(np.float64)
        max_k = self.params.split_silhouette_max_k

        def score(R: np.ndarray) -> float:
            S = cosine_similarity_matrix(R)
            return float(best_cut_silhouette(S, max_k)[0]) if max_k > 2 else sides_silhouette(R, *bipartition(S))

        return reference_score(U, score, draws=draws, seed=self.params.seed, method="rotation")
