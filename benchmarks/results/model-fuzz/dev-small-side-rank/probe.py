"""probe.py ROOT SEEDS OUTDIR [strategy]: runs CFL on each seed (10 rounds, seeded) and saves every
small-side evidence test: the rows U, their true groups, the sides, structure and reference."""
import json, sys, os
import numpy as np
root = sys.argv[1]
sys.path[:0] = [root, root + '/tests', root + '/benchmarks']
from fuzz.cell import draw_cell
from fuzz.data import true_groups
from fuzz import run
from model_matrix.cells import partition_of
import clusterfed.strategies.cfl as cfl
out = sys.argv[3]; os.makedirs(out, exist_ok=True)
name = sys.argv[4] if len(sys.argv) > 4 else 'cfl'
ctx = {}
orig_ref = cfl.evidence_reference
def ref(U, smallest, **kw):
    t = orig_ref(U, smallest, **kw)
    ctx['test'] = (t, smallest, kw.get('members'))
    return t
cfl.evidence_reference = ref
orig_rs = cfl.refuse_structure
def rs(state, server_round, cluster, p, reports, **kw):
    ctx.pop('test', None)
    r = orig_rs(state, server_round, cluster, p, reports, **kw)
    if 'test' in ctx and ctx['test'][0].test == 'small':
        t, smallest, members = ctx['test']
        n = ctx['n'] = ctx.get('n', 0) + 1
        g = ctx['groups']
        labels = [g[partition_of(k)] for k in p.keys]
        side = [0 if k in p.sides[0] else 1 for k in p.keys]
        np.savez_compressed(f"{out}/{ctx['seed']}-{n}.npz", U=p.U, labels=labels, side=side)
        with open(f"{out}/events.jsonl", 'a') as fh:
            fh.write(json.dumps({'seed': ctx['seed'], 'n': n, 'round': server_round, 'cluster': cluster,
                                 'members': members, 'rows': len(p.keys), 'smallest': smallest,
                                 'structure': p.structure, 'reference': t.reference, 'passed': t.passes(p.structure),
                                 'labels': labels, 'side': side, 'refused': r is not None}) + '\n')
    return r
cfl.refuse_structure = rs
with open(f"{out}/rows.jsonl", 'a') as fh:
    for seed in [int(s) for s in sys.argv[2].split(',')]:
        cell = draw_cell(seed); ctx['seed'] = seed; ctx['groups'] = true_groups(cell); ctx['n'] = 0
        row = run.run_strategy(cell, name, 10)
        fh.write(json.dumps({'seed': seed, 'strategy': name, 'label': cell.label(), 'clusters': row['clusters'], 'ari': row['ari'],
                             'accuracy': row['accuracy'], 'last_line': row['last_line']}) + '\n'); fh.flush()
