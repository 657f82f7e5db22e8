"""Wall time per round of the in-process engine (the same work before and after a change).

    python benchmarks/bench_round_time.py --label after --out benchmarks/results/round_time.json

Runs fedavg, fedclust and cfl on digits (label-swap, 20 clients, 10 rounds, seed 0) three
times each and records the median of the mean round_seconds; the JSON keeps one entry per
label so two code versions can be compared on one machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

STRATEGIES = ("fedavg", "fedclust", "cfl")
SETTING = {"partitioner": "label-swap", "num-clients": 20, "rounds": 10, "seed": 0}


def one_run(strategy: str) -> float:
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({**SETTING, "strategy": strategy, "out-dir": tmp})
        simulate(config, engine="inprocess", stream=None)
        rounds = [json.loads(x) for x in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    return statistics.mean(r["round_seconds"] for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="name of this code version, e.g. before / after")
    parser.add_argument("--out", default="benchmarks/results/round_time.json")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    entry = {"commit": commit, "date": time.strftime("%Y-%m-%d %H:%M"), "setting": SETTING, "mean_round_seconds": {}}
    for strategy in STRATEGIES:
        times = [one_run(strategy) for _ in range(args.repeats)]
        entry["mean_round_seconds"][strategy] = {"median": statistics.median(times), "runs": times}
        print(f"{args.label} {strategy}: median mean round {statistics.median(times):.3f}s over {times}", flush=True)
    data[args.label] = entry
    if "before" in data and "after" in data:
        data["ratio_after_over_before"] = {
            s: data["after"]["mean_round_seconds"][s]["median"] / data["before"]["mean_round_seconds"][s]["median"]
            for s in STRATEGIES}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
