"""Which layer's updates show the clients' groups: each candidate layer's rows are cut
as ``cluster_auto`` cuts them (best-silhouette dendrogram cut, tested against group-free
data of the same size and shape, ``null_reference``), and the layer whose accepted cut is
best separated is taken, or a nearly as well separated one whose cut refines it (``most_structured``).

Beyond the papers: FedClust (Islam et al., ICPP 2024) and AdaCFL compare "the final
layer", which is the classifier head only when the head is the model's last layer and
trains. A user's model may end with an auxiliary decoder, or train only a head on a frozen
backbone; the evidence of the clients' own updates finds the layer that separates them.

Picking the best of several layers is several tests: each layer's cut must beat the best
of ``reference_draws`` × (number of layers) group-free draws (a Bonferroni-style
correction of the one-layer 5 % test), so that IID clients stay one cluster as often as
with one layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .agglomerative import DEFAULT_MAX_CLUSTERS, cluster_auto

# rows scored per layer at most: the choice of a layer needs the groups' shape, not every
# client (a seeded sample of rows; the chosen layer's cut then runs on all of them)
MAX_SCORED_ROWS = 100
# two layers' margins this close are as well separated: the finer of two agreeing cuts is taken
NEAR_MARGIN = 0.05


@dataclass(frozen=True)
class LayerScore:
    """One candidate layer: its best cut's silhouette (None: fewer than 3 rows), the
    number of clusters the cut accepted (1: no structure found), the silhouette it had
    to reach (the fixed bar, or the group-free reference's lowered one)."""

    layer: str
    silhouette: float | None
    clusters: int
    required: float
    reference: float | None
    labels: tuple[int, ...] | None = None  # the accepted cut's cluster per scored row

    @property
    def margin(self) -> float:
        """How far the best cut's silhouette clears the bar it had to reach."""
        return -np.inf if self.silhouette is None else self.silhouette - self.required

    def record(self) -> dict:
        return {"layer": self.layer, "silhouette": self.silhouette, "clusters": self.clusters,
                "required": self.required, "reference": self.reference}


def score_layers(rows: dict[str, np.ndarray], *, metric: str, linkage: str, min_silhouette: float,
                 reference_draws: int, seed: int = 0, max_clusters: int | None = DEFAULT_MAX_CLUSTERS,
                 max_rows: int = MAX_SCORED_ROWS) -> list[LayerScore]:
    """Each layer's ``LayerScore``, in the order of ``rows`` (layer -> one row per client,
    the same clients in every layer)."""
    if not rows:
        raise ValueError("no candidate layer to score")
    draws = reference_draws * len(rows)
    scores = []
    for layer, X in rows.items():
        X = np.asarray(X, dtype=np.float64)
        if len(X) > max_rows:
            X = X[scored_rows(len(X), seed, max_rows)]
        cut = cluster_auto(X, metric=metric, linkage=linkage, min_silhouette=min_silhouette, max_clusters=max_clusters,
                           reference_draws=draws, seed=seed)
        required = min_silhouette if cut.required is None else float(cut.required)
        scores.append(LayerScore(layer, cut.silhouette, int(cut.num_clusters), required, cut.reference,
                                 tuple(int(v) for v in cut.labels)))
    return scores


def scored_rows(n: int, seed: int, max_rows: int = MAX_SCORED_ROWS) -> np.ndarray:
    """The rows ``score_layers`` scores of ``n``: all, or a seeded sample of ``max_rows``."""
    if n <= max_rows:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_rows, replace=False))


def record_margin(record: dict) -> float:
    """``LayerScore.margin`` of its ``record``."""
    return -np.inf if record["silhouette"] is None else record["silhouette"] - record["required"]


def finer_than(chosen: dict, records: list[dict]) -> str:
    """Words for a chosen layer (a ``LayerScore.record``) taken by ``most_structured`` over one
    that cleared its bar by more, whose cut it refines (empty when none did)."""
    pool = [r for r in records if r["clusters"] > 1 and r["silhouette"] is not None]
    if chosen.get("taken") and any(r.get("taken") is False for r in pool):
        # chosen among the layers whose cut the strategy would take (most_structured's passing)
        pool = [r for r in pool if r.get("taken")]
    top = max(pool, key=record_margin, default=None)
    if top is None or top["layer"] == chosen["layer"]:
        return ""
    return (f", {chosen['clusters']} clusters: a finer cut of {top['layer']}'s {top['clusters']} "
            f"(silhouette {top['silhouette']:.2f}), within {NEAR_MARGIN} of its margin")


def refines(fine: tuple[int, ...] | None, coarse: tuple[int, ...] | None) -> bool:
    """Whether every cluster of ``fine`` lies inside one cluster of ``coarse`` (same rows)."""
    if fine is None or coarse is None or len(fine) != len(coarse):
        return False
    inside: dict[int, int] = {}
    return all(inside.setdefault(f, c) == c for f, c in zip(fine, coarse))


def most_structured(scores: list[LayerScore], near: float = NEAR_MARGIN,
                    passing: set[str] | None = None) -> LayerScore:
    """The layer to compare: among the layers whose cut found clusters, the one whose
    silhouette clears its bar by most; when none found any, the one that came closest
    (the run then stays one cluster, and says which layers were scored). Ties: the
    earlier layer. A layer whose cut clears its bar by nearly as much (within ``near``) and
    refines the best one's (the same groups, some of them cut further) is taken instead:
    two layers agree on the coarse groups and one sees more of them (a small auxiliary head
    that tells 3 of 5 label groups apart beside the classifier that tells all 5).
    ``passing``: the layers whose cut the strategy would take (it reproduces and beats
    group-free rotations); when any found clusters, the choice is among them."""
    found = [s for s in scores if s.clusters > 1]
    if passing is not None and any(s.layer in passing for s in found):
        found = [s for s in found if s.layer in passing]
    best = max(found or scores, key=lambda s: s.margin)
    finer = [s for s in found if s.clusters > best.clusters and s.margin >= best.margin - near
             and refines(s.labels, best.labels)]
    return max(finer, key=lambda s: s.margin) if finer else best
