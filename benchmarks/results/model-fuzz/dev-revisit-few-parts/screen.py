"""Run strategies on model_fuzz cells, a row per run with every round line, and every revisit
cut where the bound on parts (``revisit._split_cut``: ``bounded_auto_cut``) gave other labels
than the unbounded auto cut (``n`` members, the ``bound``, the parts before and after). A run
with none ends as on the commit before: the revisit's cut is its only change.

    PYTHONPATH=.:tests:benchmarks python benchmarks/results/model-fuzz/dev-revisit-few-parts/screen.py \
        SEEDS STRATEGIES OUT.jsonl

Rows only: no tables, no figure (``model_fuzz.py`` makes those).
"""
import json, sys
import numpy as np
import model_fuzz
import fuzz.run as fuzz_run
from fuzz.data import true_groups
from model_matrix.cells import one_thread, partition_of
from clusterfed.strategies import revisit as rv
from sklearn.metrics import adjusted_rand_score
kept, changed = [], []
class KeptLines(fuzz_run.RoundLines):
    def __init__(self):
        super().__init__(); kept.append(self)
fuzz_run.RoundLines = KeptLines
orig = rv._split_cut
def split_cut(X, params):
    labels, bound = orig(X, params)
    if bound is not None:
        old = rv._revisit_cut(X, params)
        if not np.array_equal(np.unique(old, return_inverse=True)[1], np.unique(labels, return_inverse=True)[1]):
            changed.append({"n": len(X), "bound": bound, "old_k": int(len(np.unique(old))), "new_k": int(len(np.unique(labels)))})
    return labels, bound
rv._split_cut = split_cut
one_thread()
for seed in map(int, sys.argv[1].split(",")):
    cell = model_fuzz.draw_cell(seed)
    for name in sys.argv[2].split(","):
        kept.clear(); changed.clear()
        row = fuzz_run.run_strategy(cell, name, 10)
        lines = kept[0].lines if kept else []
        row.update(seed=seed, label=cell.label(), lines=lines, bound_changed=list(changed))
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(seed, name, row.get("ari"), row.get("clusters"), row.get("accuracy"), "changed", len(changed), flush=True)
