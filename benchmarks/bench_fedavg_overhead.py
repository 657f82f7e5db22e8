"""Our `fedavg` (clustered base, K = 1) against Flower's built-in `FedAvg` (`flwr-fedavg`).

    PYTHONPATH=$PWD python benchmarks/bench_fedavg_overhead.py [--engine inprocess|flower] [--seeds 0,1,2] [--rounds 30]

Same data, seed and clients; runs alternate (ours, Flower's) so that machine load hits
both alike. Writes benchmarks/results/fedavg_overhead_<engine>.json and prints a table:
per seed the final accuracy of each, the largest per-round accuracy difference, and the
wall-time ratio ours / Flower's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent

from clusterfed.config import parse_config  # noqa: E402
from clusterfed.results import load_run  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="inprocess", choices=("inprocess", "flower"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            result = {"seed": seed}
            for strategy in ("fedavg", "flwr-fedavg"):
                out = Path(tmp) / f"{strategy}-{seed}"
                config = parse_config({"strategy": strategy, "seed": seed, "rounds": args.rounds, "num-clients": 20,
                                       "out-dir": str(out)})
                summary = simulate(config, engine=args.engine, stream=None)
                result[strategy] = {"final_accuracy": summary["final_accuracy"], "wall_seconds": summary["wall_seconds"],
                                    "accuracy": [r["accuracy"] for r in load_run(out)[0]],
                                    "total_mb": summary["total_mb"]}
            ours, theirs = result["fedavg"], result["flwr-fedavg"]
            result["max_round_accuracy_diff"] = max(abs(a - b) for a, b in zip(ours["accuracy"], theirs["accuracy"]))
            result["final_accuracy_diff"] = ours["final_accuracy"] - theirs["final_accuracy"]
            result["wall_ratio"] = ours["wall_seconds"] / theirs["wall_seconds"]
            rows.append(result)
            print(f"seed {seed}: fedavg {ours['final_accuracy']:.4f} ({ours['wall_seconds']:.1f}s)  flwr-fedavg "
                  f"{theirs['final_accuracy']:.4f} ({theirs['wall_seconds']:.1f}s)  max |Δacc| "
                  f"{result['max_round_accuracy_diff']:.2e}  wall ratio {result['wall_ratio']:.2f}", flush=True)
    out = ROOT / "results" / f"fedavg_overhead_{args.engine}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python " + " ".join(map(shlex.quote, sys.argv)), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
