# Offline probe on recordings of benchmarks/archive/scripts/record_updates.py (run in the folder that holds rec/<setting>_s<seed>.npz).
# Recordings: for s in iid rotation label-swap label-groups; do for seed in 0 1; do python benchmarks/archive/scripts/record_updates.py --setting $s --seed $seed --rounds 40 --out rec; done; done
import sys, numpy as np
sys.path.insert(0, __import__('os').environ.get('CLUSTERFED_ROOT', '.'))
from clusterfed.clustering.split_rules import merge_pairs, sides_silhouette
for f in ['label-groups_s0','label-groups_s1','rotation_s0','rotation_s1','label-swap_s0','label-swap_s1']:
    d=dict(np.load(f'rec/{f}.npz')); g=d['groups']
    for t in (10,20,30,40):
        U=np.concatenate([d[l][t-1] for l in ['conv1','conv2','fc1','fc2']],axis=1).astype(float)
        clusters={}
        for grp in sorted(set(g)):
            idx=np.flatnonzero(g==grp); h=len(idx)//2
            clusters[f'{grp}a']=U[idx[:h]]; clusters[f'{grp}b']=U[idx[h:]]
        # all pair stats
        same=[];diff=[]
        names=list(clusters)
        for i,a in enumerate(names):
            for b in names[i+1:]:
                ma,mb=clusters[a].mean(0),clusters[b].mean(0); c=ma@mb/np.linalg.norm(ma)/np.linalg.norm(mb)
                s=sides_silhouette(np.vstack([clusters[a],clusters[b]]),np.arange(len(clusters[a])),np.arange(len(clusters[a]),len(clusters[a])+len(clusters[b])))
                (same if a[:-1]==b[:-1] else diff).append((c,s))
        same=np.array(same); diff=np.array(diff)
        mp=merge_pairs(clusters,min_cosine=0.5,max_silhouette=0.1)
        ok=sum(p.a[:-1]==p.b[:-1] for p in mp)
        print(f, t, f"same-group halves cos {same[:,0].min():.2f}..{same[:,0].max():.2f} sil {same[:,1].min():.2f}..{same[:,1].max():.2f} | different groups cos max {diff[:,0].max():.2f} sil min {diff[:,1].min():.2f} | merged {ok}/{len(same)} right, {len(mp)-ok} wrong")
