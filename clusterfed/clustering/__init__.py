"""Pure NumPy/SciPy clustering math for clustered federated learning (no torch, no flwr)."""

from .agglomerative import (
    DEFAULT_MAX_CLUSTERS,
    DEFAULT_MIN_SILHOUETTE,
    LINKAGES,
    AutoCut,
    cluster_auto,
    cluster_by_threshold,
    cluster_into_k,
    labels_with_keys,
    linkage_matrix,
    relabel_in_order,
)
from .cluster_count import STABILIZERS, ClusterCountController, CountStep, loss_reduction_ratio
from .distances import (
    DISTANCE_METHODS,
    METRICS,
    blocked_pairwise_distances,
    condensed_distances,
    distance_matrix,
    distances_to,
    flatten_partial,
    pairwise_distances,
    stack_partials,
)
from .entropy import (
    cluster_within_preclusters,
    entropy_preclusters,
    label_entropy,
    merge_across_preclusters,
    num_classes_present,
)
from .newcomers import cluster_references, default_epsilon, nearest_cluster, nearest_references, place_newcomer
from .sampled import SampledClustering, cluster_sampled
