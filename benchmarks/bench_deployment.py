"""Where a deployed round's time goes, and bytes deployed vs in-process.

The same 3-client FedClust run (digits, label-groups "0,1;2,3", data from
``clusterfed partition``) three ways: in-process (InProcessGrid with the same
``data-path``/``client-key`` node configs), and deployed on 127.0.0.1 (TLS SuperLink, three
SuperNodes, ``flwr run``) with the ServerApp polling the SuperLink every
``CLUSTERFED_POLL_SECONDS`` for each value given, and with each ``warm-worker`` node setting
given (``false``: every message imports torch and loads the data in Flower's fresh
ClientApp process; ``auto``: the message is handed to the device's warm worker). Also timed on
their own: the start-up of a ClientApp process (Python + flwr + clusterfed imports) and
loading one device's data.

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_deployment.py --polls 3,0.5 --rounds 3
    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_deployment.py --polls 0.5 --warm false,auto --rounds 3 \
        --out benchmarks/results/deployment_warm.json

Writes benchmarks/results/deployment.json (the markdown report is written by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from clusterfed.experiments.settings import setting  # noqa: E402
from test_deployment import FLWR, Federation, rows, wait_for  # noqa: E402

DATA = setting("digits-two-pairs-3")


def run_config(out: Path, rounds: int) -> dict:
    return {**DATA, "strategy": "fedclust", "rounds": rounds, "timeout": 120.0, "fedclust.cluster-epochs": 2,
            "batch-size": 32, "device": "cpu", "checkpoint": False, "out-dir": str(out)}


def overrides(config: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return str(v).lower()
        return json.dumps(v) if isinstance(v, str) else str(v)
    return " ".join(f"{k}={value(v)}" for k, v in config.items())


def io_bytes(pid: int) -> int:
    """Bytes a process read and wrote through syscalls (sockets included)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def summarise(records: list[dict], wall: float) -> dict:
    return {"wall_seconds": round(wall, 2), "round_seconds": [r["round_seconds"] for r in records],
            "bytes_down": sum(r["bytes_down"] for r in records), "bytes_up": sum(r["bytes_up"] for r in records),
            "eval_bytes_down": sum(r["eval_bytes_down"] for r in records), "ari": records[-1]["ari"],
            "accuracy": records[-1]["accuracy"],
            "reply_lag_seconds": [r.get("reply_lag_seconds") for r in records]}


def inprocess(tmp: Path, parts: Path, rounds: int) -> dict:
    from flwr.supercore.task_identity import TaskIdentity

    from clusterfed.client_app import app as client_app
    from clusterfed.config import parse_config
    from clusterfed.runner.inprocess import InProcessGrid
    from clusterfed.server_app import run_server

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    out = tmp / "inprocess"
    configs = [{"client-key": f"dev-{i}", "data-path": str(parts / f"part-{i}.npz")} for i in range(3)]
    grid = InProcessGrid(client_app, 3, node_configs=configs)
    started = time.perf_counter()
    run_server(grid, parse_config(run_config(out, rounds)), stream=None, node_wait_seconds=0)
    return summarise(rows(out), time.perf_counter() - started)


def deployed(tmp: Path, parts: Path, rounds: int, poll: float, warm: str = "false",
             superexec_poll: float | None = None) -> dict:
    folder = tmp / f"deployed-poll-{poll:g}-warm-{warm}"
    folder.mkdir()
    out = folder / "out"
    federation = Federation(folder)
    federation.env["CLUSTERFED_POLL_SECONDS"] = str(poll)
    if superexec_poll is not None:
        federation.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(superexec_poll)
    try:
        federation.start_superlink()
        superlink = federation.processes[0]
        for i in range(3):
            federation.start_node(f"dev-{i}", parts / f"part-{i}.npz", f"warm-worker={json.dumps(warm)}")
        time.sleep(5)  # let the nodes register: the run's own wait is not what is measured
        before = io_bytes(superlink.pid)
        started = time.perf_counter()
        run = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config",
                                overrides(run_config(out, rounds))], "flwr-run")
        run.wait(timeout=1800)
        wall = time.perf_counter() - started
        superlink_io = io_bytes(superlink.pid) - before
    finally:
        federation.close()
    result = summarise(rows(out), wall)
    result["superlink_io_bytes"] = superlink_io
    result["status"] = json.loads((out / "status.json").read_text())["status"]
    return result


def timed(args: list[str], env: dict, repeats: int = 3) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(args, env=env, check=True, capture_output=True)
        times.append(round(time.perf_counter() - started, 3))
    return times


def components(parts: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CLUSTERFED_CACHE_DIR=str(cache))
    load = ("import time, sys; t = time.perf_counter(); "
            "from clusterfed.datasets.device_data import load_device_data; "
            f"d = load_device_data({str(parts / 'part-0.npz')!r}, 'digits'); d.x_train.sum(); "
            "print(time.perf_counter() - t)")
    first = subprocess.run([sys.executable, "-c", load], env=env, check=True, capture_output=True, text=True)
    cached = subprocess.run([sys.executable, "-c", load], env=env, check=True, capture_output=True, text=True)
    return {
        "python_start_seconds": timed([sys.executable, "-c", "pass"], env),
        "import_flwr_clientapp_seconds": timed([sys.executable, "-c", "import flwr.clientapp"], env),
        "import_flwr_and_clusterfed_client_app_seconds": timed(
            [sys.executable, "-c", "import flwr.clientapp, clusterfed.client_app"], env),
        "import_flwr_and_clusterfed_client_entry_seconds": timed(
            [sys.executable, "-c", "import flwr.clientapp, clusterfed.client_entry"], env),
        "load_device_data_first_seconds": round(float(first.stdout.strip().splitlines()[-1]), 3),
        "load_device_data_cached_seconds": round(float(cached.stdout.strip().splitlines()[-1]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--polls", default="3,0.5")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", default="false", help="warm-worker node settings to run, e.g. false,auto")
    parser.add_argument("--superexec-poll", type=float, default=None,
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes (Flower's default: 1 s)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "deployment.json"))
    args = parser.parse_args()
    from clusterfed.cli import main as cli_main

    tmp = Path(tempfile.mkdtemp(prefix="clusterfed-bench-deploy-"))
    parts = tmp / "parts"
    settings = sum((["--set", f"{k}={json.dumps(v) if isinstance(v, str) else v}"] for k, v in DATA.items()), [])
    assert cli_main(["partition", "--out", str(parts), *settings]) == 0
    result = {"config": run_config(Path("OUT"), args.rounds), "components": components(parts, tmp / "cache"),
              "inprocess": inprocess(tmp, parts, args.rounds), "deployed": {}}
    result["load_average_before"] = os.getloadavg()
    for poll in (float(p) for p in args.polls.split(",")):
        for warm in args.warm.split(","):
            name = f"poll={poll:g}s" + ("" if warm == "false" else f",warm-worker={warm}")
            if args.superexec_poll is not None:
                name += f",superexec-poll={args.superexec_poll:g}s"
            result["deployed"][name] = deployed(tmp, parts, args.rounds, poll, warm, args.superexec_poll)
            result["deployed"][name]["load_average_after"] = os.getloadavg()
            print(name, json.dumps(result["deployed"][name]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
