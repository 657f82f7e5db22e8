"""replay.py CAPTURE.pkl[,..] [VARIANTS] [SCALE] : the recorded group-test calls tested again, as now and with changed rules, by class of the cut (probe code)."""
import sys, pickle, collections, numpy as np
from sklearn.metrics import adjusted_rand_score, calinski_harabasz_score
from sklearn.preprocessing import normalize
import clusterfed.clustering.group_structure as gs
from clusterfed.clustering.agglomerative import cluster_auto
from clusterfed.clustering.null_reference import MAX_REFERENCE_ROWS, reference_draws, sampled_rows
from clusterfed.clustering.oneshot import cut_into

def ch(X, l):
    return calinski_harabasz_score(X, l) if 1 < len(np.unique(l)) < len(X) else 0.0

def variant(X, labels, kw, unit=False, stat="sep", clear=2.0, sil=True):
    metric, linkage, mc, draws, seed = kw['metric'], kw['linkage'], kw['max_clusters'], kw['draws'], kw['seed']
    X = np.asarray(X, np.float64); k = len(np.unique(labels))
    if k < 2 or draws <= 0 or len(X) < gs.MIN_ROWS: return None
    if metric == "cosine" and (unit or len(X) < gs.SMALL_ROWS): X = normalize(X)
    kept = sampled_rows(len(X), MAX_REFERENCE_ROWS, np.random.default_rng(seed))
    if kept is not None: X, labels = X[kept], labels[kept]
    f = gs.separation if stat == "sep" else ch
    own = cluster_auto(X, metric=metric, linkage=linkage, min_silhouette=-1.0, max_clusters=mc)
    rs, rsep = -1.0, 0.0
    for R in reference_draws(X, draws, seed, MAX_REFERENCE_ROWS, "rotation"):
        if sil:
            cut = cluster_auto(R, metric=metric, linkage=linkage, min_silhouette=-1.0, max_clusters=mc)
            rs = max(rs, -1.0 if cut.silhouette is None else cut.silhouette)
        rsep = max(rsep, f(R, cut_into(R, k, metric=metric, linkage=linkage)))
    s = f(X, labels); osil = -1.0 if own.silhouette is None else own.silhouette
    if s <= rsep: return False
    return (not sil) or osil > rs or s >= clear * rsep

VARIANTS = {"cur": {}, "unit": {"unit": True}, "ch": {"stat": "ch"}, "unit-ch": {"unit": True, "stat": "ch"},
            "sep-only": {"sil": False}, "unit-sep-only": {"unit": True, "sil": False}}
def klass(c):
    t = np.asarray(c['truth']); l = np.asarray(c['labels'])
    if c['shift'] == 'iid' or len(np.unique(t)) == 1: return "null"
    if adjusted_rand_score(t, l) >= 0.9: return "right"
    # coarse: each true group within one part
    if all(len(np.unique(l[t == g])) == 1 for g in np.unique(t)): return "coarse"
    return "wrong"
runs = []
for f in sys.argv[1].split(','):
    runs += pickle.load(open(f, 'rb'))
names = sys.argv[2].split(',') if len(sys.argv) > 2 else list(VARIANTS)
tab = collections.defaultdict(lambda: collections.Counter()); cellhit = collections.defaultdict(lambda: collections.Counter())
for run in runs:
    seen = collections.defaultdict(set)
    for c in run['calls']:
        if c['truth'] is None or len(np.unique(c['labels'])) < 2: continue
        k = klass(c)
        for v in names:
            p = variant(c['X'], np.asarray(c['labels']), c['kw'], **VARIANTS[v])
            if p is None: continue
            tab[(v, k)]['n'] += 1; tab[(v, k)]['pass'] += int(p)
            if p: seen[v].add(k)
    for v in names:
        for k in seen[v]: cellhit[(v, k)][run['strategy']] += 1
print("variant class calls passes   cells-with-a-pass(fedclust/adacfl)")
for v in names:
    for k in ["null", "right", "coarse", "wrong"]:
        t = tab[(v, k)]
        print(f"{v:14s} {k:7s} {t['n']:5d} {t['pass']:5d} ({t['pass']/max(1,t['n']):.2f})  {dict(cellhit[(v,k)])}")

# coarsening: on a failing k-part cut, the rows' own dendrogram cut into k-1 .. 2 parts, each tested
def coarsen(X, labels, kw, draws_scale=1):
    k = len(np.unique(labels)); kw2 = dict(kw, draws=kw['draws'] * draws_scale)
    first = variant(X, labels, kw)
    if first is None or first: return first, labels
    for kk in range(k - 1, 1, -1):
        l2 = cut_into(np.asarray(X, np.float64), kk, metric=kw['metric'], linkage=kw['linkage'])
        if variant(X, l2, kw2): return True, l2
    return False, labels
if len(sys.argv) > 3:
    scale = int(sys.argv[3]); res = collections.Counter()
    for run in runs:
        for c in run['calls']:
            if c['truth'] is None or len(np.unique(c['labels'])) < 3 or c['passes'] is not False: continue
            k = klass(c)
            p, l2 = coarsen(c['X'], np.asarray(c['labels']), c['kw'], scale)
            k2 = klass(dict(c, labels=l2)) if p else "-"
            res[(k, p, k2)] += 1
            if p: print(run['seed'], run['strategy'], c['where'], len(c['labels']), k, '->', len(np.unique(l2)), k2)
    print(sorted(res.items()))
