"""clusterfed as a library, measured.

1. In-process round time on the built-in task, before/after the public-strategy refactor:
   the same runs with the code of ``--before`` (a checkout of the earlier commit) and of this
   tree, alternated ``--reps`` times in one run so that machine load hits both alike.
2. A stock Flower ClientApp against the ``clusterfed.client`` helper on the same user task
   (tests/userapp: an MLP on synthetic sensor readings, two groups with swapped label
   meaning): bytes up, accuracy and ARI per strategy.

    git worktree add /tmp/cf-before c4b4c03; git worktree add /tmp/cf-after HEAD
    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_library.py --before /tmp/cf-before \
        --after /tmp/cf-after --out benchmarks/results/library
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from clusterfed.experiments.manifest import git_state
from clusterfed.experiments.settings import setting

ROOT = Path(__file__).resolve().parent.parent
# the runs timed on both trees (built here from the settings registry and passed as JSON, so the
# earlier tree needs no registry)
RUNS = {
    "fedavg": {**setting("digits-pairs"), "strategy": "fedavg", "rounds": 10},
    "fedclust": {**setting("digits-pairs"), "strategy": "fedclust", "rounds": 10, "cluster-epochs": 3},
    "cfl": {**setting("digits-rotation"), "strategy": "cfl", "rounds": 10},
}
TIMED = """
import json, sys, tempfile, time
from clusterfed.config import parse_config
from clusterfed.simulation import simulate
values = json.loads(sys.argv[1])
with tempfile.TemporaryDirectory() as out:
    config = parse_config({**values, "out-dir": out, "checkpoint": False})
    started = time.perf_counter()
    summary = simulate(config, engine="inprocess", stream=None)
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "final_accuracy": summary["final_accuracy"], "bytes_up": summary.get("total_mb_up")}))
"""


def timed_run(tree: Path, values: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", TIMED, json.dumps(values)], env=env, capture_output=True, text=True,
                         cwd=tree)
    if out.returncode:
        raise SystemExit(f"run in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def round_times(before: Path, after: Path, reps: int) -> dict:
    rows: dict[str, dict[str, list]] = {name: {"before": [], "after": []} for name in RUNS}
    for rep in range(reps):
        for name, values in RUNS.items():
            for side, tree in (("before", before), ("after", after)) if rep % 2 == 0 else (("after", after), ("before", before)):
                result = timed_run(tree, values)
                rows[name][side].append(result)
                print(f"rep {rep} {name:9s} {side:6s} {result['seconds']:.2f} s  accuracy {result['final_accuracy']:.4f}",
                      flush=True)
    table = {}
    for name, sides in rows.items():
        b = sorted(r["seconds"] for r in sides["before"])
        a = sorted(r["seconds"] for r in sides["after"])
        rounds = RUNS[name]["rounds"]
        table[name] = {"before_s_per_round_median": b[len(b) // 2] / rounds, "after_s_per_round_median": a[len(a) // 2] / rounds,
                       "ratio_after_over_before": a[len(a) // 2] / b[len(b) // 2],
                       "same_accuracy": all(x["final_accuracy"] == y["final_accuracy"]
                                            for x, y in zip(sides["before"], sides["after"])),
                       "runs": sides}
    return table


def helper_task():
    from clusterfed.client import ClientTask, TaskData
    from userapp.task import Net, load_data

    return ClientTask(model_fn=lambda context, config: Net(),
                      data_fn=lambda context, config: TaskData(*load_data(int(context.node_config["partition-id"]))))


def stock_vs_helper(rounds: int) -> dict:
    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity
    from sklearn.metrics import adjusted_rand_score
    from userapp.client_app import app as stock_app
    from userapp.task import Net, group_of

    import clusterfed
    from clusterfed.client import client_app
    from clusterfed.runner.inprocess import InProcessGrid

    helper_app = client_app(helper_task())
    out = {}
    for name in ("FedAvg", "FedClust", "CFL", "LayerCFL", "HiCFL"):
        for kind, app in (("stock", stock_app), ("helper", helper_app)):
            TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
            grid = InProcessGrid(app, 8, node_configs=[{"partition-id": i} for i in range(8)])
            torch.manual_seed(0)
            started = time.perf_counter()
            result = getattr(clusterfed, name)().start(
                grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}))
            seconds = time.perf_counter() - started
            keys = sorted(result.assignment)
            partition = {k: (int(k.removeprefix("node-")) - 1000 if k.startswith("node-") else int(k)) for k in keys}
            ari = adjusted_rand_score([group_of(partition[k]) for k in keys], [result.assignment[k] for k in keys])
            last = result.evaluate_metrics_clientapp[rounds]
            accuracy = last.get("eval_acc", last.get("eval-accuracy"))
            out[f"{name}/{kind}"] = {"bytes_up": result.traffic["bytes_up"], "bytes_down": result.traffic["bytes_down"],
                                     "accuracy": round(float(accuracy), 4), "ari": round(float(ari), 3),
                                     "clusters": len(set(result.assignment.values())), "seconds": round(seconds, 2)}
            print(name, kind, out[f"{name}/{kind}"], flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, help="checkout of the code before the refactor")
    parser.add_argument("--after", type=Path, default=ROOT, help="checkout of the code after it (default: this tree)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-stock", action="store_true", help="only the round times")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the stock-vs-helper runs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "library")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "commit": git_state(ROOT)["commit"],
                "machine": {"cores": os.cpu_count(), "load_at_start": os.getloadavg(), "python": platform.python_version()}}
    path = args.out / "library.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results["manifest"] = manifest
    if not args.skip_stock:
        results["stock_vs_helper"] = stock_vs_helper(args.rounds)
        path.write_text(json.dumps(results, indent=2) + "\n")
    if args.before:
        results["round_time"] = round_times(args.before, args.after, args.reps)
    manifest["load_at_end"] = os.getloadavg()
    (args.out / "library.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out / 'library.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
