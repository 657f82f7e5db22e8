"""Run strategies on model_fuzz cells with the small-side test at 19 draws; note every test whose
decision 99 draws would have changed (data beats the best of 19 but not of 99)."""
import json, sys
from functools import partial
import model_fuzz
import fuzz.run as fuzz_run
from model_matrix.cells import one_thread
import clusterfed.clustering.layer_split as ls
import clusterfed.strategies.hicfl_stability as hs
kept, flips = [], []
class KeptLines(fuzz_run.RoundLines):
    def __init__(self):
        super().__init__(); kept.append(self)
fuzz_run.RoundLines = KeptLines
orig = ls.small_side_reference
def wrapped(U, smallest, *, rule, draws, min_split_size, max_k, seed, members=None):
    r = orig(U, smallest, rule=rule, draws=draws, min_split_size=min_split_size, max_k=max_k, seed=seed, members=members)
    if r is not None and (members or len(U)) < 2 * min_split_size:
        r99 = ls.reference_score(U.astype(float), partial(ls.best_cut_score, max_k=max_k), draws=99, seed=seed, method="rotation")
        data = ls.best_cut_score(U.astype(float), max_k=max_k)
        if r < data <= r99 or r99 < data <= r:
            flips.append((len(U), smallest, round(data, 3), round(r, 3), round(r99, 3)))
    return r
ls.small_side_reference = wrapped
hs.small_side_reference = wrapped
one_thread()
for seed in map(int, sys.argv[1].split(",")):
    cell = model_fuzz.draw_cell(seed)
    for name in sys.argv[2].split(","):
        kept.clear(); flips.clear()
        row = fuzz_run.run_strategy(cell, name, 10)
        row.update(seed=seed, label=cell.label(), lines=kept[0].lines if kept else [], flips=list(flips))
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(seed, name, row.get("ari"), row.get("clusters"), row.get("accuracy"), len(flips), flush=True)
