"""How many log lines a stock Flower ClientApp run prints: Flower's own FedAvg against
clusterfed's strategies, on the same user app (tests/userapp: a stock quickstart-style
ClientApp, an MLP on synthetic sensor readings), under Flower's simulation engine (Ray),
the path ``flwr run`` takes. Each run is its own process; every line it prints to stdout
and stderr is counted, and tracebacks are counted apart.

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_log_lines.py --out benchmarks/results/log_lines
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("flwr-fedavg", "fedavg", "fedclust", "cfl")

# one run: the user's ServerApp with the named strategy, on Flower's simulation engine
ONE_RUN = """
import sys
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import ServerApp
from flwr.simulation import run_simulation
from userapp.client_app import app as client_app
from userapp.task import Net

name, clients, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
server_app = ServerApp()

@server_app.main()
def main(grid, context):
    if name == "flwr-fedavg":
        from flwr.serverapp.strategy import FedAvg
        strategy = FedAvg(fraction_train=1.0)
    else:
        import clusterfed
        strategy = {"fedavg": clusterfed.FedAvg, "fedclust": clusterfed.FedClust, "cfl": clusterfed.CFL}[name]()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                   train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}))

run_simulation(server_app=server_app, client_app=client_app, num_supernodes=clients,
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": 2, "num_gpus": 0}})
"""


def count(name: str, clients: int, rounds: int, tree: Path, log: Path | None = None) -> dict:
    env = {"PYTHONPATH": f"{tree}:{tree / 'tests'}", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-c", ONE_RUN, name, str(clients), str(rounds)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    lines = (done.stdout + done.stderr).splitlines()
    if log is not None:
        log.mkdir(parents=True, exist_ok=True)
        (log / f"{name}.log").write_text(done.stdout + done.stderr)
    return {"strategy": name, "clients": clients, "rounds": rounds, "exit_code": done.returncode,
            "log_lines": len(lines), "tracebacks": sum("Traceback (most recent call last)" in line for line in lines),
            "info_round_lines": sum("[ROUND" in line or "clusterfed round" in line.lower() for line in lines)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose clusterfed is measured")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--log", type=Path, help="keep each run's output in this folder")
    args = parser.parse_args()
    from clusterfed.experiments.manifest import start_manifest, write_manifest

    manifest = start_manifest(vars(args))
    rows = []
    for name in args.strategies.split(","):
        row = count(name, args.clients, args.rounds, args.tree.resolve(), args.log)
        print(json.dumps(row), flush=True)
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "log_lines.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_manifest(args.out, manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
