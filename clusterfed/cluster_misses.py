"""Why a clustered run's final clustering misses its true groups, in the run's own words:
the summary.json key for the way it missed (more clusters than groups, fewer, or as many
with members mixed) and a sentence quoting the strategy's ``cluster_count_basis``. One
cluster has its own ``one_cluster_reason``, said by the strategy. Reads true groups, so
only the recorder (``clusterfed.results``) calls it, never a strategy."""

from __future__ import annotations

from typing import Any

from clusterfed.explain.generic import DESIGNED_SINGLE, singleton_words

OVER_SPLIT_ARI = 0.9  # below this ARI, a clustered run's final clustering is a miss to account for

# summary.json key for each way a run with more than one cluster can miss its true groups,
# and its label in the printed summary (one cluster has its own ``one_cluster_reason``)
MISS_LABELS = {"over_split_reason": "over-split", "under_split_reason": "under-split",
               "mixed_clusters_reason": "mixed clusters"}
SINGLE_CLIENTS = "single_client_clusters"  # summary.json key: the clusters of one client, named


def single_client_clusters(clusters: dict[str, Any]) -> str | None:
    """The final clusters of a single client, named (``cluster 3 is a single client (c7)``);
    None when there are none or the strategy gives each client its own cluster by design."""
    if clusters.get("strategy") in DESIGNED_SINGLE:
        return None
    return singleton_words(clusters.get("assignment") or {})


def cluster_miss_reason(summary: dict[str, Any], clusters: dict[str, Any],
                        true_groups: dict[str, int]) -> tuple[str, str] | None:
    """(key, sentence) for a run whose final ARI is under OVER_SPLIT_ARI with more than one cluster:
    ``over_split_reason`` for more clusters than true groups, ``under_split_reason`` for fewer,
    ``mixed_clusters_reason`` for as many but with members mixed; the sentence quotes the
    strategy's ``cluster_count_basis``. None when the run is no miss or the strategy says nothing."""
    groups = {true_groups[k] for k in clusters.get("assignment") or {} if k in true_groups}
    found, ari = len(set((clusters.get("assignment") or {}).values())), summary.get("final_ari")
    if not clusters.get("cluster_count_basis") or not groups or found <= 1 or ari is None or ari >= OVER_SPLIT_ARI:
        return None
    basis = clusters["cluster_count_basis"]
    if found > len(groups):
        return "over_split_reason", f"{found} clusters for {len(groups)} true groups: {basis}"
    if found < len(groups):
        return "under_split_reason", f"{found} clusters for {len(groups)} true groups: {basis}"
    return "mixed_clusters_reason", (f"{found} clusters for {len(groups)} true groups, but their members mix "
                                     f"the groups (ARI {ari:.2f}): {basis}")
