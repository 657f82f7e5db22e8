"""analyse.py DIR...: p-values of alternative small-side statistics over 999 rotations per event."""
import json, sys, glob
from functools import partial
import numpy as np
sys.path[:0] = ['.']  # run from the repository root
from clusterfed.clustering.null_reference import reference_draws
from clusterfed.clustering.layer_split import best_cut_score
from clusterfed.clustering.split_scores import cosine_similarity_matrix
from clusterfed.clustering.bipartition import bipartition
from clusterfed.clustering.split_rules import sides_silhouette
from sklearn.metrics import adjusted_rand_score as ari
B = int(__import__('os').environ.get('B', 499))
def two(R):
    return sides_silhouette(R, *bipartition(cosine_similarity_matrix(R)))
def centred(R, max_k=6):
    return best_cut_score(R - R.mean(axis=0), max_k=max_k)
stats = {'cur': partial(best_cut_score, max_k=6), 'two': two, 'cen': centred}
out = []
for d in sys.argv[1:]:
    for line in open(f'{d}/events.jsonl'):
        e = json.loads(line)
        z = np.load(f"{d}/{e['seed']}-{e['n']}.npz")
        U = z['U'].astype(np.float64); labels = list(z['labels']); side = list(z['side'])
        groups = len(set(labels))
        kind = 'null' if groups == 1 else ('true' if ari(labels, side) >= 0.99 else 'mixed')
        draws = reference_draws(U, B, seed=e['seed'] * 100 + e['n'], method='rotation')
        r = {'seed': e['seed'], 'n': e['n'], 'round': e['round'], 'members': e['members'], 'rows': e['rows'],
             'smallest': e['smallest'], 'kind': kind, 'groups': groups, 'passed': e['passed'],
             'structure': round(e['structure'], 3), 'reference': round(e['reference'], 3)}
        for name, f in stats.items():
            obs = f(U); null = np.array([f(R) for R in draws])
            r[name] = round((1 + (null >= obs - 1e-12).sum()) / (B + 1), 3)
        out.append(r); print(json.dumps(r), flush=True)
