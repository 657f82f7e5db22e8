"""screen.py ROOT SEEDS OUT.jsonl [STRATEGIES]: the strategies (default FedClust and AdaCFL) on each seed (10 rounds, seeded), one row each,
with fired: what a trial's switch counted (empty here: nothing counted)."""
import json, sys
root = sys.argv[1]
sys.path[:0] = [root, root + '/tests', root + '/benchmarks']
from fuzz.cell import draw_cell
from fuzz import run
import clusterfed.strategies.revisit as rv
fired = getattr(rv, 'FIRED', [])
strategies = sys.argv[4].split(',') if len(sys.argv) > 4 else ['fedclust', 'adacfl']
with open(sys.argv[3], 'a') as fh:
    for seed in [int(s) for s in sys.argv[2].split(',')]:
        cell = draw_cell(seed)
        for name in strategies:
            fired.clear()
            row = run.run_strategy(cell, name, 10)
            fh.write(json.dumps({'seed': seed, 'strategy': name, 'clusters': row['clusters'], 'ari': row['ari'],
                                 'accuracy': row['accuracy'], 'fedavg': row.get('fedavg_accuracy'), 'singletons': row['singletons'],
                                 'fired': list(fired), 'last_line': row['last_line']}) + '\n'); fh.flush()
