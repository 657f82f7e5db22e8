# Offline probe on recordings of benchmarks/archive/scripts/record_updates.py (run in the folder that holds rec/<setting>_s<seed>.npz).
# Recordings: for s in iid rotation label-swap label-groups; do for seed in 0 1; do python benchmarks/archive/scripts/record_updates.py --setting $s --seed $seed --rounds 40 --out rec; done; done
import sys, numpy as np
sys.path.insert(0, __import__('os').environ.get('CLUSTERFED_ROOT', '.'))
from clusterfed.clustering.bipartition import cosine_similarity_matrix
for f in ['rotation_s0','label-swap_s0','label-groups_s0','rotation_s1','label-swap_s1','label-groups_s1']:
    d=dict(np.load(f'rec/{f}.npz')); g=d['groups']
    out=[]
    for l in ['conv2','fc1']:
        for t in (10,20,30):
            U=d[l][t-1].astype(float); S=cosine_similarity_matrix(U)
            cross=g[:,None]!=g[None,:]; amax=S[cross].max(); bound=np.sqrt((1-amax)/2)
            gam=[]; gnn=[]
            for i in range(len(g)):
                same=np.flatnonzero((g==g[i])&(np.arange(len(g))!=i))
                mu=U[same].mean(0); gam.append(np.linalg.norm(U[i]-mu)/np.linalg.norm(mu))
                a=S[i,same].max(); gnn.append(np.sqrt(max(1/a-1,0)) if a>0 else np.inf)
            # window average of 5 rounds
            W=d[l][t-5:t].astype(float).mean(0); SW=cosine_similarity_matrix(W); aw=SW[cross].max()
            gw=[]
            for i in range(len(g)):
                same=np.flatnonzero((g==g[i])&(np.arange(len(g))!=i)); mu=W[same].mean(0)
                gw.append(np.linalg.norm(W[i]-mu)/np.linalg.norm(mu))
            out.append(f"{l} r{t}: a_x {amax:.2f} bound {bound:.2f} gLOO {max(gam):.2f} gNN {max(gnn):.2f} | W5 bound {np.sqrt((1-aw)/2):.2f} gLOO {max(gw):.2f}")
    print(f); print('  '+'\n  '.join(out))
