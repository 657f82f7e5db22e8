"""wait6.py SEEDS STRATS OUT.jsonl : revisits judge a cluster at 6 repliers (strict small rule) instead of 8."""
import sys, json, model_fuzz
import fuzz.run as fr
from model_matrix.cells import one_thread
from clusterfed.strategies import revisit
from clusterfed.clustering.group_structure import MIN_ROWS
revisit.replies_needed = lambda m: max(revisit.REVISIT_MIN_MEMBERS, min(MIN_ROWS, m))
one_thread()
for seed in map(int, sys.argv[1].split(',')):
    cell = model_fuzz.draw_cell(seed)
    for s in sys.argv[2].split(','):
        row = fr.run_strategy(cell, s, 10); row['seed'] = seed
        open(sys.argv[3], 'a').write(json.dumps(row) + '\n')
        print(seed, s, row.get('ari'), row.get('clusters'), row.get('accuracy'), flush=True)
