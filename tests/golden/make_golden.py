"""Record per-round client accuracies, bytes and assignments of short in-process runs of
every strategy, so a refactor can be checked to leave the numbers unchanged.

    python tests/golden/make_golden.py tests/golden/runs.json [name ...]

With names, only those entries are recorded anew; the others are kept from the file.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

# each entry: (name, run-config overrides). Small and short: the suite replays them all.
# Clients one after another: the numbers pinned are those of the sequential path (the batched
# one agrees to float rounding, tests/test_batched_clients.py)
BASE = {"num-clients": 6, "rounds": 3, "partitioner": "label-groups", "label-groups": "0-4;5-9", "batch-size": 32,
        "client-batching": "off"}
# criteria that always fire, so the bi-partitioning runs split and place newcomers by descent
FORCE = {"split-criteria": "absolute", "eps1": 100.0, "eps2": 0.001, "split-min-silhouette": 0.0}
# the papers' rules where the defaults now go beyond them (merging; HiCFL's absolute ε, every
# member below it, reference sign split, stop rule): these entries pin the papers' behaviour
PAPER_BIPARTITION = {"merge": False, "similarity-decay": 0.0, "split-timing": "criteria"}
PAPER_HICFL = {**PAPER_BIPARTITION, "hicfl-timing": "all", "hicfl-split": "reference", "hicfl-min-silhouette": -1}
RUNS = {
    "fedavg": {"strategy": "fedavg", "fraction-train": 0.5},
    "fedprox": {"strategy": "fedprox"},
    "local": {"strategy": "local"},
    "oracle": {"strategy": "oracle"},
    "flwr-fedavg": {"strategy": "flwr-fedavg"},
    "fedclust": {"strategy": "fedclust", "label-groups": "0,1;2,3;4,5", "num-clients": 12,
                 "newcomer-fraction": 0.2, "newcomer-round": 3},
    "adacfl": {"strategy": "adacfl", "label-groups": "0,1;2,3;4,5", "num-clients": 12, "cluster-epochs": 3,
               "newcomer-fraction": 0.2, "newcomer-round": 3},
    "cfl": {"strategy": "cfl", "partitioner": "rotation", "num-clients": 12, "rounds": 8, "min-split-round": 3, **FORCE,
            "newcomer-fraction": 0.2, "newcomer-round": 7, **PAPER_BIPARTITION},
    "layercfl": {"strategy": "layercfl", "partitioner": "rotation", "num-clients": 12, "rounds": 8,
                 "min-split-round": 3, **FORCE, "correct-clustering-check": False, "skew": "feature", **PAPER_BIPARTITION},
    "hicfl": {"strategy": "hicfl", "partitioner": "rotation", "num-clients": 12, "rounds": 8, "window": 2, "stability-eps": 5.0, **FORCE,
              "newcomer-fraction": 0.2, "newcomer-round": 7, **PAPER_HICFL},
    # the defaults beyond the papers (merging; HiCFL relative ε, median timing, linkage split, structure test)
    "cfl-merge": {"strategy": "cfl", "partitioner": "rotation", "num-clients": 12, "rounds": 8, "min-split-round": 3,
                  **FORCE, "newcomer-fraction": 0.2, "newcomer-round": 7},
    "hicfl-defaults": {"strategy": "hicfl", "partitioner": "rotation", "num-clients": 12, "rounds": 10, "window": 2,
                       "min-split-round": 3, "newcomer-fraction": 0.2, "newcomer-round": 9},
}
FIELDS = ("bytes_down", "bytes_up", "transmissions", "num_clusters", "ari", "client_accuracy")


def run_one(name: str, out: Path, overrides: dict | None = None) -> dict:
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    config = parse_config({**BASE, **RUNS[name], **(overrides or {}), "out-dir": str(out)})
    simulate(config, engine="inprocess", stream=None)
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    clusters = json.loads((out / "clusters.json").read_text())
    return {"rounds": [{k: r[k] for k in FIELDS} for r in rounds], "assignment": clusters["assignment"]}


def canonical_assignment(assignment: dict) -> list[list[str]]:
    """Cluster ids may be renumbered; the partition of clients may not change."""
    groups: dict = {}
    for key, cluster in assignment.items():
        groups.setdefault(cluster, []).append(key)
    return sorted(sorted(v) for v in groups.values())


if __name__ == "__main__":
    target = Path(sys.argv[1])
    only = sys.argv[2:]
    records = json.loads(target.read_text()) if only else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in only or RUNS:
            records[name] = run_one(name, Path(tmp) / name)
            print(name, records[name]["rounds"][-1]["num_clusters"], "clusters", flush=True)
    target.write_text(json.dumps(records, indent=1, sort_keys=True))
