"""The clustering step only: FedClust 1 round, AdaCFL 2 rounds; a row per run with its lines."""
import json, sys
import model_fuzz
import fuzz.run as fuzz_run
from model_matrix.cells import one_thread
kept = []
class KeptLines(fuzz_run.RoundLines):
    def __init__(self):
        super().__init__(); kept.append(self)
fuzz_run.RoundLines = KeptLines
one_thread()
ROUNDS = {"fedclust": 1, "adacfl": 2}
for seed in map(int, sys.argv[1].split(",")):
    cell = model_fuzz.draw_cell(seed)
    for name in sys.argv[2].split(","):
        kept.clear()
        row = fuzz_run.run_strategy(cell, name, ROUNDS[name])
        row.update(seed=seed, label=cell.label(), lines=kept[0].lines if kept else [])
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(seed, name, row.get("ari"), row.get("clusters"), flush=True)
