# Offline probe on recordings of benchmarks/archive/scripts/record_updates.py (run in the folder that holds rec/<setting>_s<seed>.npz).
# Recordings: for s in iid rotation label-swap label-groups; do for seed in 0 1; do python benchmarks/archive/scripts/record_updates.py --setting $s --seed $seed --rounds 40 --out rec; done; done
import sys, numpy as np
sys.path.insert(0, __import__('os').environ.get('CLUSTERFED_ROOT', '.'))
from clusterfed.clustering.stability import StabilityTracker, centred_updates, reference_split
from clusterfed.clustering.bipartition import cosine_similarity_matrix, split_silhouette
layers = ['conv1','conv2','fc1','fc2']
for f in sys.argv[1:]:
    d = dict(np.load(f)); g = d['groups']; n = d['num_examples']; R, m = d['conv1'].shape[:2]
    tr = StabilityTracker(5, 0.05*0.05, min_kept_fraction=0.05); base = {}
    print("==", f)
    stats = {l: {"pure": [], "impure": [], "relmax": []} for l in layers}
    for t in range(R):
        line = []
        for l in layers:
            for i in range(m): tr.add(i, l, d[l][t, i])
            w = np.array([tr.windowed(i, l) or np.nan for i in range(m)])
            if np.isnan(w).any(): continue
            base.setdefault(l, np.median(w))
            U = {i: d[l][t, i].astype(float) for i in range(m)}
            C = centred_updates(U, {i: n[i] for i in range(m)})
            sides = reference_split(C, {i: w[i] for i in range(m)})
            if not sides: line.append(f"{l} none"); continue
            a, b = sides
            pure = not (set(g[a]) & set(g[b])) and len(set(g)) > 1
            S = cosine_similarity_matrix(np.stack([U[i] for i in range(m)]))
            sil = split_silhouette(S, a, b)
            stats[l]["pure" if pure else "impure"].append((t+1, round(sil, 2)))
            line.append(f"{l} {w.max()/base[l]:.1f} {'P' if pure else 'x'}{len(a)} {sil:.2f}")
        if line and (t+1) % 1 == 0: print(t+1, " | ".join(line))
    for l in layers:
        p = [s for _, s in stats[l]['pure']]; x = [s for _, s in stats[l]['impure']]
        print(f"  {l}: pure {len(p)} sil {min(p, default=np.nan):.2f}..{max(p, default=np.nan):.2f}; impure {len(x)} max sil {max(x, default=np.nan):.2f}")
