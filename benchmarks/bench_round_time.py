"""Wall time per round of the in-process engine (the same work before and after a change).

    PYTHONPATH=$PWD python benchmarks/bench_round_time.py --label after --out benchmarks/results/round_time.json

Runs fedavg, fedclust and cfl on digits (label-swap, 20 clients, 10 rounds, seed 0) three
times each and records the median of the mean round_seconds (wall) and of the process's
CPU seconds per round (what the engine and the clients computed; far less sensitive to
other load on the machine than wall time). The JSON keeps one entry per label so two code
versions can be compared on one machine: run the old version with PYTHONPATH pointing at
its checkout. ``--set key=value`` adds config (e.g. ``checkpoint=false``).
"""

from __future__ import annotations

import argparse
import os
import runpy
import json
import statistics
import tempfile
import time
from pathlib import Path

STRATEGIES = ("fedavg", "fedclust", "cfl")
# the setting from this tree's registry, read by path: the code measured may be an earlier
# checkout (PYTHONPATH) that has no registry
_REGISTRY = runpy.run_path(str(Path(__file__).resolve().parents[1] / "clusterfed" / "experiments" / "settings.py"))
SETTING = {**_REGISTRY["setting"]("digits-label-swap"), "rounds": 10, "seed": 0}
git_state = runpy.run_path(str(Path(__file__).resolve().parents[1] / "clusterfed" / "experiments" / "manifest.py"))["git_state"]


def one_run(strategy: str, extra: dict) -> tuple[float, float]:
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({**SETTING, **extra, "strategy": strategy, "out-dir": tmp})
        cpu = time.process_time()
        simulate(config, engine="inprocess", stream=None)
        cpu = time.process_time() - cpu
        rounds = [json.loads(x) for x in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    return statistics.mean(r["round_seconds"] for r in rounds), cpu / len(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="name of this code version, e.g. before / after")
    parser.add_argument("--out", default="benchmarks/results/round_time.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    extra = {k: json.loads(v) if v in ("true", "false") or v.replace(".", "").isdigit() else v
             for k, v in (pair.split("=", 1) for pair in args.overrides)}
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    commit = (git_state()["commit"] or "")[:7]
    entry = {"commit": commit, "date": time.strftime("%Y-%m-%d %H:%M"), "setting": {**SETTING, **extra},
             "load_average": os.getloadavg(), "mean_round_seconds": {}, "cpu_seconds_per_round": {}}
    for strategy in STRATEGIES:
        runs = [one_run(strategy, extra) for _ in range(args.repeats)]
        wall, cpu = [w for w, _ in runs], [c for _, c in runs]
        entry["mean_round_seconds"][strategy] = {"median": statistics.median(wall), "runs": wall}
        entry["cpu_seconds_per_round"][strategy] = {"median": statistics.median(cpu), "runs": cpu}
        print(f"{args.label} {strategy}: median round {statistics.median(wall):.3f}s wall, "
              f"{statistics.median(cpu):.3f}s CPU", flush=True)
    data[args.label] = entry
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
