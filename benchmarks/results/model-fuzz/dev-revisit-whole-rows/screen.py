"""Run FedClust and AdaCFL (and any registered strategy) on model_fuzz cells, a row per run.

    PYTHONPATH=.:tests:benchmarks python benchmarks/results/model-fuzz/dev-revisit-whole-rows/screen.py \
        SEEDS STRATEGIES '{"fedclust": {"revisit_rounds": 1}}' OUT.jsonl

SEEDS: comma-separated development seeds; STRATEGIES: comma-separated registry names; the
JSON: keyword overrides per strategy; OUT.jsonl: one ``fuzz.run.run_strategy`` row per line,
with the cell's seed, appended. Rows only: no tables, no figure (``model_fuzz.py`` makes those).
"""
import functools
import json
import sys

import model_fuzz
import fuzz.run as fuzz_run
from model_matrix.cells import one_thread

seeds = [int(s) for s in sys.argv[1].split(",")]
strategies = sys.argv[2].split(",")
overrides = json.loads(sys.argv[3])
out = sys.argv[4]
registered = fuzz_run.strategy_class
fuzz_run.strategy_class = lambda name: functools.partial(registered(name), **overrides.get(name, {}))
one_thread()
for seed in seeds:
    cell = model_fuzz.draw_cell(seed)
    for name in strategies:
        row = fuzz_run.run_strategy(cell, name, 10)
        row["seed"] = seed
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(seed, name, row.get("ari"), row.get("clusters"), row.get("accuracy"), flush=True)
