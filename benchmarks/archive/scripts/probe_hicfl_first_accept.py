# Offline probe on recordings of benchmarks/archive/scripts/record_updates.py (run in the folder that holds rec/<setting>_s<seed>.npz).
# Recordings: for s in iid rotation label-swap label-groups; do for seed in 0 1; do python benchmarks/archive/scripts/record_updates.py --setting $s --seed $seed --rounds 40 --out rec; done; done
import re
cur=None; rows={}
for line in open('hicfl_reference_split.txt'):
    if line.startswith('=='): cur=line.split()[1].split('/')[1]; rows[cur]=[]; continue
    if not line[0].isdigit(): continue
    t=int(line.split()[0]); parts=line[len(str(t))+1:].strip().split(' | ')
    c=[]
    for p in parts:
        f=p.split()
        if len(f)<4: continue
        c.append((f[0], float(f[1]), f[2][0]=='P', float(f[3])))
    rows[cur].append((t,c))
for tau in (0.35,0.4,0.45):
  for relcap in (99, 1.5):
    out=[]
    for k,v in rows.items():
        res='-'
        for t,c in v:
            c2=[x for x in c if x[1]<relcap]
            if not c2: continue
            best=max(c2,key=lambda x:x[3])
            if best[3]>=tau: res=f"r{t}{best[0]}{'P' if best[2] else 'x'}"; break
        out.append(f"{k.replace('.npz','')}:{res}")
    print(tau, relcap, ' '.join(out))
