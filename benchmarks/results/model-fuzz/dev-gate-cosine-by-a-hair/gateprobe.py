"""Every call of the one-shot gate (``clusterfed.strategies.oneshot.gate``) in the first 2
rounds of a strategy on model_fuzz cells, a JSON line each: the rows and parts of the cut, the
most alike pair of its clusters' mean changes (cosine), the halves, the rotation test's
numbers, whether the gate deferred the cut, and (for calls that name the clients) the cut's
ARI against the true groups. Probe code: it patches the gate from outside.

    PYTHONPATH=.:tests:benchmarks python benchmarks/results/model-fuzz/dev-gate-cosine-by-a-hair/gateprobe.py \
        SEEDS STRATEGY > OUT.txt
"""
import sys, json
import numpy as np
import model_fuzz
import fuzz.run as fr
from fuzz.data import true_groups
from model_matrix.cells import one_thread, partition_of
from clusterfed.strategies import oneshot
from sklearn.metrics import adjusted_rand_score
orig = oneshot.gate
CUR = {}
def gate(X, labels, halves, params, strategy, fallback=None, keys=None, *a, **k):
    res = orig(X, labels, halves, params, strategy, fallback, keys, *a, **k)
    cos = oneshot.most_alike(X, labels)[0] if len(np.unique(labels)) > 1 else None
    t = oneshot.groups_tested(X, labels, params) if len(np.unique(labels)) > 1 else None
    truth = None
    if keys is not None:
        g = CUR['groups']; truth = [g[partition_of(key)] for key in keys]
    ari = adjusted_rand_score(truth, labels) if truth else None
    print(json.dumps({"seed": CUR['seed'], "rows": len(X), "k": int(len(np.unique(labels))), "cos": None if cos is None else round(float(cos), 3),
                      "halves": None if halves is None else halves[2], "test": None if t is None else t.as_record(),
                      "deferred": bool(res.deferred), "ari_truth": None if ari is None else round(ari, 3)}), flush=True)
    return res
oneshot.gate = gate
one_thread()
for seed in map(int, sys.argv[1].split(',')):
    cell = model_fuzz.draw_cell(seed)
    CUR.update(seed=seed, groups=true_groups(cell))
    fr.run_strategy(cell, sys.argv[2], 2)
