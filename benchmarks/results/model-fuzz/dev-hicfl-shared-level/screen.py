"""screen_hicfl.py ROOT SEEDS OUT.jsonl: HiCFL on each seed (10 rounds, seeded, ROOT's code with HICFL_MS and
HICFL_SHARED from the environment), one row each, with the number of layers each group-free test shared its level
among (fired)."""
import json, os, sys
root = sys.argv[1]
sys.path[:0] = [root, root + '/tests', root + '/benchmarks']
from fuzz.cell import draw_cell
from fuzz import run
import clusterfed.strategies.hicfl_stability as hs
fired = getattr(hs, 'FIRED', [])
with open(sys.argv[3], 'a') as fh:
    for seed in [int(s) for s in sys.argv[2].split(',')]:
        cell = draw_cell(seed)
        fired.clear()
        row = run.run_strategy(cell, 'hicfl', 10)
        fh.write(json.dumps({'seed': seed, 'shift': cell.shift, 'min_silhouette': os.environ.get('HICFL_MS'),
                             'shared': os.environ.get('HICFL_SHARED'), 'clusters': row['clusters'], 'ari': row['ari'],
                             'accuracy': row['accuracy'], 'fired': len(fired), 'max_tests': max(fired, default=0),
                             'last_line': row['last_line']}) + '\n'); fh.flush()
