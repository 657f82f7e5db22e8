"""Run strategies on model_fuzz cells, a row per run with every round line, and how many of
those lines held two clusters apart (a merge refused: "two tasks whose models converge") and
merged two.

    PYTHONPATH=.:tests:benchmarks python benchmarks/results/model-fuzz/dev-revisit-held-apart/screen.py \
        SEEDS STRATEGIES OUT.jsonl

SEEDS: comma-separated seeds; STRATEGIES: comma-separated registry names; OUT.jsonl: one
``fuzz.run.run_strategy`` row per line, with the cell's seed and round lines, appended.
Rows only: no tables, no figure (``model_fuzz.py`` makes those).
"""
import json
import sys

import model_fuzz
import fuzz.run as fuzz_run
from model_matrix.cells import one_thread

kept = []


class KeptLines(fuzz_run.RoundLines):
    def __init__(self):
        super().__init__()
        kept.append(self)


fuzz_run.RoundLines = KeptLines
one_thread()
for seed in map(int, sys.argv[1].split(",")):
    cell = model_fuzz.draw_cell(seed)
    for name in sys.argv[2].split(","):
        kept.clear()
        row = fuzz_run.run_strategy(cell, name, 10)
        lines = kept[0].lines if kept else []
        row.update(seed=seed, lines=lines, held=sum("two tasks whose models converge" in line for line in lines),
                   merged=sum(line.count(" merged: ") - line.count("not merged: ") for line in lines))
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps(row) + "\n")
        print(seed, name, row.get("ari"), row.get("clusters"), row.get("accuracy"), "held", row["held"],
              "merged", row["merged"], flush=True)
