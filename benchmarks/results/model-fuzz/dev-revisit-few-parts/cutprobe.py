"""Every revisit cut of a strategy on model_fuzz cells (``revisit._maybe_split``), a JSON line
each: the members cut (``n``), the true groups among them (``truek``), the auto cut's parts and
best silhouette (``best_k``, ``best``), the group-free reference it had to beat (``ref``,
drawn only for a best cut below ``auto-min-silhouette``), the round line's words (``res``), and
for each number of parts k up to 8 (and the auto cut's): its silhouette, its ARI against the
true groups, whether it beats group-free rotations (``group_test``) and its part sizes. Probe
code: it patches the revisit from outside.

    PYTHONPATH=.:tests:benchmarks python benchmarks/results/model-fuzz/dev-revisit-few-parts/cutprobe.py \
        SEEDS STRATEGY > OUT.jsonl
"""
import sys, json
import numpy as np
import model_fuzz
import fuzz.run as fr
from fuzz.data import true_groups
from model_matrix.cells import one_thread, partition_of
from clusterfed.strategies import revisit as rv
from clusterfed.clustering.agglomerative import cluster_auto, cluster_into_k
from sklearn.metrics import adjusted_rand_score
orig = rv._maybe_split
CUR = {}
def ms(state, params, server_round, cluster, keys, X, first, new_cluster, strategy):
    res = orig(state, params, server_round, cluster, keys, X, first, new_cluster, strategy)
    g = CUR['groups']; truth = [g[partition_of(k)] for k in keys]
    if len(keys) >= 4:
        a = cluster_auto(X, metric=params.distance, linkage=params.linkage, min_silhouette=params.auto_min_silhouette,
                         reference_draws=params.auto_reference_draws, seed=params.seed, max_clusters=params.max_clusters)
        prof = {}
        for k in sorted(a.scores):
            if k > 8 and k != a.num_clusters: continue
            lab = cluster_into_k(X, k, metric=params.distance, linkage=params.linkage)
            t = rv.groups_tested(X, lab, params)
            prof[k] = [round(a.scores[k], 3), round(adjusted_rand_score(truth, lab), 2), None if t is None else bool(t.passes),
                       sorted(np.bincount(lab).tolist())]
        print(json.dumps({"seed": CUR['seed'], "round": server_round, "cluster": cluster, "n": len(keys), "truek": len(set(truth)),
                          "best_k": a.num_clusters, "best": a.silhouette, "ref": a.reference, "req": a.required,
                          "res": (res or '')[:300], "prof": prof}), flush=True)
    return res
rv._maybe_split = ms
one_thread()
for seed in map(int, sys.argv[1].split(',')):
    cell = model_fuzz.draw_cell(seed)
    CUR.update(seed=seed, groups=true_groups(cell))
    fr.run_strategy(cell, sys.argv[2], 10)
