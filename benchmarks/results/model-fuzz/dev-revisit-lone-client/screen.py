"""screen.py ROOT SEEDS OUT.jsonl: FedClust and AdaCFL on each seed (10 rounds, seeded), one row each,
with the revisit cuts that set one client apart alone ("fired": round, cluster, keys) when ROOT's
revisit has the rule (recorded by wrapping clustering.oneshot.lone_rows as revisit calls it)."""
import json, sys
root = sys.argv[1]
sys.path[:0] = [root, root + '/tests', root + '/benchmarks']
from fuzz.cell import draw_cell
from fuzz import run
import clusterfed.strategies.revisit as rv
fired = []
if hasattr(rv, 'lone_rows'):
    orig = rv.lone_rows
    def wrapped(labels, within=None):
        out = orig(labels, within)
        if out: fired.append(len(labels))
        return out
    rv.lone_rows = wrapped
with open(sys.argv[3], 'a') as fh:
    for seed in [int(s) for s in sys.argv[2].split(',')]:
        cell = draw_cell(seed)
        for name in ('fedclust', 'adacfl'):
            fired.clear()
            row = run.run_strategy(cell, name, 10)
            fh.write(json.dumps({'seed': seed, 'strategy': name, 'clusters': row['clusters'], 'ari': row['ari'],
                                 'accuracy': row['accuracy'], 'singletons': row['singletons'], 'lone_refusals': len(fired),
                                 'last_line': row['last_line']}) + '\n'); fh.flush()
