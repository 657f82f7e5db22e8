"""Per round and pair of clusters of a strategy's revisits on a model_fuzz cell, the merge
test's numbers: members judged, mean-update cosine, whether the auto cut of the two together
is one cluster, whether the two beat group-free rotations (``revisit._apart``), and the
members' mean update norms; the run's ARI, clusters and accuracy last. Probe code: it patches
``revisit._merges`` from outside.

    PYTHONPATH=.:tests:benchmarks python benchmarks/results/model-fuzz/dev-revisit-held-apart/pairs.py \
        SEED STRATEGY > OUT.txt
"""
import functools, json, sys
import numpy as np
import model_fuzz
import fuzz.run as fr
from model_matrix.cells import one_thread
from clusterfed.strategies import revisit as rv
seed, name = int(sys.argv[1]), sys.argv[2]
orig = rv._merges
def merges(state, params, server_round, rows, strategy):
    cl = sorted(c for c, X in rows.items() if len(X) >= 2)
    for i, a in enumerate(cl):
        for b in cl[i+1:]:
            together = np.vstack([rows[a], rows[b]])
            cos = rv.mean_cosine(rows[a], rows[b])
            one = len(np.unique(rv._revisit_cut(together, params))) == 1
            ap = rv._apart(together, len(rows[a]), params)
            na, nb = np.linalg.norm(rows[a], axis=1).mean(), np.linalg.norm(rows[b], axis=1).mean()
            print(f"r{server_round} {a}-{b} n={len(rows[a])},{len(rows[b])} cos={cos:.2f} onecut={one} apart={ap} norms={na:.3g},{nb:.3g}", flush=True)
    return orig(state, params, server_round, rows, strategy)
rv._merges = merges
one_thread()
cell = model_fuzz.draw_cell(seed)
row = fr.run_strategy(cell, name, 10)
print({k: row[k] for k in ('ari', 'clusters', 'accuracy')})
