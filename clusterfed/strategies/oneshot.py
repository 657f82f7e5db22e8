"""What the one-shot clustered strategies (FedClust, AdaCFL) share as declarations: the
clustering step's parameters, the state fields their parts read and write, and what a
part needs from the strategy that builds it.

The strategies hold their papers' steps (``fedclust.py``, ``adacfl.py``); the machinery
both call is in parts they build (composition, not a base class):

- ``partial_weights.PartialWeights``: the clustering phase's upload of the compared
  layer(s), stock ClientApps sent their reply back, the rows to cluster, and the layer
  chosen by evidence (``layer_choice.py``);
- ``oneshot_clusters.OneShotClusters``: the dendrogram cut, the clusters and their
  references, newcomers placed at the nearest reference, and what the run says about its
  number of clusters.

A part (``OneShotPart``, a ``parts.Part``) keeps a reference to the strategy (``OneShotHost``) and reads and
writes the strategy's ``state`` through it, never a copy: ``init`` and ``set_state`` (a resumed
checkpoint) replace the state object, and a part must follow. The fields the parts use are
declared once in ``OneShotState``, which each strategy's ``State`` extends, so a
checkpoint holds the same fields under the same names as before the parts existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from pydantic import Field

from clusterfed.clustering import DEFAULT_MAX_CLUSTERS
from clusterfed.clustering.null_reference import DEFAULT_DRAWS
from clusterfed.strategies.base import ClusteredState, StrategyParams
from clusterfed.strategies.exchange import Arrays, Ask, ClientInfo
from clusterfed.strategies.layer_choice import MAX_CANDIDATE_LAYERS, LayerChoice
from clusterfed.strategies.parts import Part

# the default of ``matrix-max-clients``: the square distance matrix (for the heat-map) of
# this many clients is a few megabytes of JSON
MAX_MATRIX_CLIENTS = 500

PositiveNumber = Annotated[float, Field(gt=0)]

# reason code -> sentence, for a run that ends with one cluster (the base's ``one_cluster_reasons``)
ONE_CLUSTER_REASONS = {
    "silhouette": "the best cut's silhouette stayed below auto-min-silhouette and below what group-free data "
                  "of the same size reaches: no cluster structure found",
    "threshold": "every client lies within lambda of the others: the cut at lambda leaves one cluster",
    "not_clustered": "the clustering step never ran (no client replied to it)",
}


class OneShotParams(StrategyParams):
    """The clustering step's parameters, shared by FedClust and AdaCFL."""

    cluster_epochs: int = Field(10, alias="cluster-epochs", ge=1,
                                description="local epochs of the clustering step (and of a newcomer's placement)")
    cluster_layers: str = Field("auto", alias="cluster-layers",
                                description="layers uploaded and compared: auto = the layer whose clients' updates show "
                                            "the most structure (every candidate layer uploaded once, in the "
                                            "clustering phase); final = the papers' rule; or a rule (smallest-fc, "
                                            "conv, fc, all) or layer names. Arrays no client changed are left out")
    max_candidate_layers: int = Field(
        MAX_CANDIDATE_LAYERS, alias="max-candidate-layers", ge=1,
        description="cluster-layers = auto: the candidate layers scored (the last ones in state-dict order); each "
                    "costs one cut with its group-free reference and is uploaded once in the clustering phase")
    matrix_max_clients: int = Field(
        MAX_MATRIX_CLIENTS, alias="matrix-max-clients", ge=0,
        description="clusters.json keeps the clients' distance matrix, and the round its cut's silhouette, up to "
                    "this many clustered clients (beyond: O(m²) memory and megabytes of JSON)")
    chain_until: Literal["stable", "epochs"] = Field(
        "stable", alias="chain-until",
        description="a stock ClientApp (it trains its own local-epochs per request) is sent its reply back until "
                    "the clients' clustering is the same after two requests in a row (stable; at most "
                    "cluster-epochs in all) or until it has trained cluster-epochs (epochs, the papers' phase)")
    lambda_: PositiveNumber | Literal["auto"] = Field(
        "auto", alias="lambda", description='distance threshold of the dendrogram cut, or "auto" = the best-silhouette cut')
    distance: Literal["l2", "cosine"] = Field(
        "cosine", description="distance between the clients' partial weights (changes from the start model)")
    linkage: Literal["average", "single", "complete", "ward"] = Field("average", description="dendrogram linkage")
    auto_min_silhouette: float = Field(
        0.25, alias="auto-min-silhouette", ge=-1, le=1,
        description='lambda = "auto": below this best silhouette the clients stay one cluster (and say so), '
                    'unless it beats what group-free data of the same size reaches (auto-reference-draws)')
    max_clusters: int = Field(
        DEFAULT_MAX_CLUSTERS, alias="max-clusters", ge=2,
        description='lambda = "auto": the most clusters a cut may form (the candidate cuts scored)')
    auto_reference_draws: int = Field(
        DEFAULT_DRAWS, alias="auto-reference-draws", ge=0,
        description='lambda = "auto": a best cut below auto-min-silhouette still counts when it beats the best '
                    'silhouette of this many group-free reference sets, the clients\' rows rotated at random about '
                    'their mean (many small clients, or a few with large layers; 0 = fixed threshold only)')


@dataclass
class OneShotState(ClusteredState):
    """The base's state and the fields the one-shot parts read and write."""

    clustered: bool = False
    # the model every clustering-phase client trains; newcomers train it too, so that
    # their partial weights are comparable with the cluster references
    cluster_start: Arrays = field(default_factory=dict)
    references: dict[int, np.ndarray] = field(default_factory=dict)
    layer_choice: LayerChoice = field(default_factory=LayerChoice)
    clustering_state: dict[str, Any] = field(default_factory=dict)


class OneShotHost(Protocol):
    """What the one-shot parts use of the strategy that builds them."""

    state: OneShotState
    params: OneShotParams
    clients: dict[str, ClientInfo]
    train_config: dict[str, Any]
    reports: list[Any]

    def train_asks(self, server_round: int, keys: list[str], *, models: dict[str, Arrays] | None = None,
                   extra: dict[str, Any] | None = None, phase: str = "train") -> list[Ask]: ...

    def reachable(self, keys: list[str]) -> list[str]: ...

    def new_cluster(self, model: Arrays, inherit: int | None = None) -> int: ...

    def compared_names(self) -> list[str]: ...

    def select_compared_layers(self, rule: str, compare: Any = None) -> list[str]: ...


class OneShotPart(Part[OneShotState]):
    """A part of a one-shot strategy (``parts.Part``: the strategy's current ``state``, never
    a copy) that also reads its ``params``."""

    host: OneShotHost

    @property
    def params(self) -> OneShotParams:
        return self.host.params
