"""capture.py SEEDS STRATS OUT.pkl : run FedClust or AdaCFL on fuzz cells (10 rounds) and record every group-test call (rows, cut, true group of each row). Probe code: it patches the strategies from outside."""
import sys, pickle, numpy as np
import model_fuzz
import fuzz.run as fr
from fuzz.data import true_groups
from fuzz.run import partition_of
from model_matrix.cells import one_thread
from clusterfed.strategies import oneshot, revisit
CAP = []; KEYS = [None]; WHERE = [None]
orig_gt = oneshot.group_test
def gt(X, labels, **kw):
    res = orig_gt(X, labels, **kw)
    keys = KEYS[0] if KEYS[0] is not None and len(KEYS[0]) == len(X) else None
    CAP.append({"X": np.asarray(X, np.float32), "labels": np.asarray(labels), "kw": kw, "keys": keys, "where": WHERE[0],
                "passes": None if res is None else res.passes})
    return res
oneshot.group_test = gt
orig_gate = oneshot.gate
def gate(X, labels, halves, params, strategy, fallback=None, keys=None, *a, **k):
    KEYS[0] = list(keys) if keys is not None else None; WHERE[0] = "gate"
    try: return orig_gate(X, labels, halves, params, strategy, fallback, keys, *a, **k)
    finally: KEYS[0] = None; WHERE[0] = None
oneshot.gate = gate
orig_ms = revisit._maybe_split
def ms(state, params, server_round, cluster, group, X, *a, **k):
    KEYS[0] = [r.key for r in group]; WHERE[0] = f"revisit{server_round}"
    try: return orig_ms(state, params, server_round, cluster, group, X, *a, **k)
    finally: KEYS[0] = None; WHERE[0] = None
revisit._maybe_split = ms
one_thread()
out = []
for seed in map(int, sys.argv[1].split(',')):
    cell = model_fuzz.draw_cell(seed)
    g = true_groups(cell)
    for strat in sys.argv[2].split(','):
        CAP.clear()
        row = fr.run_strategy(cell, strat, 10)
        for c in CAP:
            c.update(seed=seed, strategy=strat, shift=cell.shift, clients=cell.clients,
                     truth=None if c['keys'] is None else [g[partition_of(k)] for k in c['keys']])
        out.append({"seed": seed, "strategy": strat, "row": row, "calls": list(CAP)})
        print(seed, strat, len(CAP), row.get('ari'), row.get('clusters'), row.get('passes'), flush=True)
        pickle.dump(out, open(sys.argv[3], 'wb'))
