"""Clients trained together vs one after another: round time and clients per second of the
in-process engine, and the server's share of a round.

    PYTHONPATH=$PWD python benchmarks/bench_batched_clients.py                       # 100 and 1,000 clients
    PYTHONPATH=$PWD python benchmarks/bench_batched_clients.py --clients 100,1000 --label gpu

The setting: MNIST rotation (0/90/180/270; the registry's ``mnist-rotation``, real MNIST from
``--data-dir``, torchvision layout), ``mnist-cnn``, one local epoch, batch 16, no checkpoints,
no report; FedAvg, FedClust and CFL; ``client-batching = off`` and ``auto`` alternated run by
run in one process (data and imports warm for both). Per run: the mean over the rounds after
the first (round 1 builds the data and admits the clients) of the round's seconds (its
``round_seconds``: train, evaluate, the strategy, the record) and of the seconds the clients
took inside the grid's pulls (their own compute, batched or not, and building their replies);
the rest of the round is the server's. Also the process's CPU seconds per round, which a
machine shared with other jobs inflates less than the wall time, the chunks the batched
runs used (clients, seconds, peak GPU bytes on CUDA) and the final accuracy, ARI and cluster
count. On the CPU the two modes have ended with the same clusters; on a GPU one decision near
its threshold fell the other way (the README says which runs, NOTES.md why).

On a machine with a GPU the clients train on it (``device = auto``); the manifest and
``results.json`` name the device. Writes ``benchmarks/results/batched-clients/<label>/``:
``results.json``, ``README.md``, ``manifest.json`` (``--label`` defaults to ``cpu`` or ``gpu``).

``--server-parts``: instead, one batched run per client count and strategy, timing the server's
parts of a steady round (messages built and copied, replies collected and validated, evaluate
replies scored, the strategy's aggregation, the round's record): ``server_parts.json`` and
``manifest-server-parts.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "batched-clients"


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA), {os.cpu_count()} CPU cores"
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "CPU")
    return f"no GPU: {model}, {os.cpu_count()} cores"


class Timings:
    """Per round: the seconds spent in the grid's pulls (the clients) and the batched chunks."""

    def __init__(self):
        from clusterfed.runner import inprocess
        from clusterfed.runner.driver import RoundDriver

        self.rounds: dict[int, float] = {}
        self.cpu_at: dict[int, float] = {}  # process CPU seconds when each round began
        self.before_steady = None  # called as round 2 begins
        self.current = 0
        self.grids = []
        pull, play, init = inprocess.InProcessGrid.pull_messages, RoundDriver.play_round, inprocess.InProcessGrid.__init__
        timings = self

        def timed_pull(grid, message_ids):
            started = time.perf_counter()
            try:
                return pull(grid, message_ids)
            finally:
                timings.rounds[timings.current] = timings.rounds.get(timings.current, 0.0) + time.perf_counter() - started

        def marked_round(driver, server_round, *args, **kwargs):
            if server_round == 2 and timings.before_steady is not None:
                timings.before_steady()
            timings.current = server_round
            timings.cpu_at[server_round] = time.process_time()
            return play(driver, server_round, *args, **kwargs)

        def kept(grid, *args, **kwargs):
            init(grid, *args, **kwargs)
            timings.grids.append(grid)

        self.patches = [(inprocess.InProcessGrid, "pull_messages", pull, timed_pull),
                        (RoundDriver, "play_round", play, marked_round),
                        (inprocess.InProcessGrid, "__init__", init, kept)]

    def __enter__(self):
        for owner, name, _, new in self.patches:
            setattr(owner, name, new)
        return self

    def __exit__(self, *exc):
        for owner, name, old, _ in self.patches:
            setattr(owner, name, old)


def run_once(clients: int, strategy: str, mode: str, rounds: int, data_dir: str, before_steady=None) -> dict:
    from clusterfed.config import parse_config
    from clusterfed.experiments.settings import setting
    from clusterfed.simulation import simulate

    values = {**setting("mnist-rotation"), "data-dir": data_dir, "model": "mnist-cnn", "num-clients": clients,
              "rounds": rounds, "seed": 0, "strategy": strategy, "checkpoint": False, "log-to": "none",
              "client-batching": mode}
    with tempfile.TemporaryDirectory() as tmp, Timings() as timings:
        timings.before_steady = before_steady
        started = time.perf_counter()
        simulate(parse_config({**values, "out-dir": tmp}), engine="inprocess", stream=None)
        wall, cpu_end = time.perf_counter() - started, time.process_time()
        rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    steady = rows[1:] or rows
    round_seconds = sum(r["round_seconds"] for r in steady) / len(steady)
    client_seconds = sum(timings.rounds.get(r["round"], 0.0) for r in steady) / len(steady)
    batched = timings.grids[-1].batched if timings.grids else None
    chunks = batched.chunks if batched is not None else []
    first = steady[0]["round"]
    cpu_per_round = (cpu_end - timings.cpu_at.get(first, cpu_end)) / len(steady)
    return {"clients": clients, "strategy": strategy, "client_batching": mode, "rounds": rounds,
            "round_seconds": [round(r["round_seconds"], 3) for r in rows],
            "steady_round_seconds": round(round_seconds, 3),
            "clients_per_second": round(clients / round_seconds, 1),
            "client_seconds": round(client_seconds, 3),
            "server_share": round(1 - client_seconds / round_seconds, 3),
            "cpu_seconds_per_round": round(cpu_per_round, 3),
            "wall_seconds": round(wall, 1),
            "chunks": len(chunks), "largest_chunk": max((c["clients"] for c in chunks), default=0),
            "peak_gpu_bytes_per_chunk": max((c["peak_bytes"] for c in chunks), default=0),
            "not_batched": sorted(batched.logged) if batched is not None else [],
            "final_accuracy": rows[-1].get("accuracy"), "final_ari": rows[-1].get("ari"),
            "num_clusters": rows[-1].get("num_clusters")}


# the server's parts of a round, by the function that does each (module, qualified name)
SERVER_PARTS = {
    "messages built": ("clusterfed.runner.link", "Link.messages"),
    "messages copied into the grid": ("clusterfed.runner.inprocess", "InProcessGrid.push_messages"),
    "replies collected (bytes, faults)": ("clusterfed.runner.link", "Link.collect"),
    "train replies validated": ("clusterfed.runner.driver", "parse_train_reply"),  # where the driver calls them
    "evaluate replies scored": ("clusterfed.runner.driver", "eval_rows"),
    "strategy: aggregation": ("clusterfed.strategies.base", "ClusteredStrategy.aggregate_clusters"),
    "round recorded": ("clusterfed.runner.driver", "record_round"),
}


def server_profile(clients: int, strategy: str, rounds: int, data_dir: str) -> dict:
    """Seconds per steady round in each of the server's parts (``SERVER_PARTS``), clients
    trained together, timed by wrapping each function (no profiler overhead elsewhere)."""
    import importlib

    spent: dict[str, float] = {}
    patches = []
    for label, (module_name, qualified) in SERVER_PARTS.items():
        owner = importlib.import_module(module_name)
        *classes, name = qualified.split(".")
        for cls in classes:
            owner = getattr(owner, cls)
        original = getattr(owner, name)

        def timed(*args, __original=original, __label=label, **kwargs):
            started = time.perf_counter()
            try:
                return __original(*args, **kwargs)
            finally:
                spent[__label] = spent.get(__label, 0.0) + time.perf_counter() - started

        patches.append((owner, name, original))
        setattr(owner, name, timed)
    marks: dict[str, float] = {}
    try:
        run = run_once(clients, strategy, "auto", rounds, data_dir, before_steady=lambda: marks.update(spent))
    finally:
        for owner, name, original in patches:
            setattr(owner, name, original)
    steady = max(rounds - 1, 1)
    parts = {label: round((spent.get(label, 0.0) - marks.get(label, 0.0)) / steady, 3) for label in SERVER_PARTS}
    server = run["steady_round_seconds"] - run["client_seconds"]
    # the rest: the strategy's own steps beyond aggregating (e.g. CFL's update norms and
    # similarities), membership, logging
    parts["rest of the server's round"] = round(server - sum(parts.values()), 3)
    return {**{k: run[k] for k in ("clients", "strategy", "steady_round_seconds", "client_seconds", "server_share")},
            "server_seconds_per_round": round(server, 3), "parts_seconds_per_round": parts}


def write_readme(folder: Path, data: dict) -> None:
    lines = ["# Clients trained together vs one after another", "",
             f"Generated by `benchmarks/bench_batched_clients.py` (`{data['command']}`); device: **{data['device']}**; "
             "commit, machine and load in `manifest.json`. MNIST rotation, `mnist-cnn`, one local epoch, batch 16; "
             "steady round = mean over the rounds after the first; clients/s = clients / steady round (whole rounds, "
             "server included); server share = the part of a round outside the clients' own work.", ""]
    if "no GPU" in data["device"]:
        lines += ["No GPU was available to this run: these are CPU numbers. On an H100/H200 run, from the repository "
                  "root, `PYTHONPATH=$PWD python benchmarks/bench_batched_clients.py --clients 100,1000` "
                  "(a few minutes); it writes `benchmarks/results/batched-clients/gpu/`.", ""]
        if not any(r["clients"] >= 10_000 for r in data["results"]):
            lines += ["10,000 clients are not run: the 10,000 MNIST images this benchmark reads give 10,000 clients "
                      "one image each, which the train/test split leaves with nothing to train on (a run at "
                      "`min-samples = 1` had every reply rejected for 0 examples). The project's 10,000-client "
                      "grids use generated 8x8 digits instead (docs/scale.md).", ""]
    lines += ["| clients | strategy | client-batching | steady round s | clients/s | CPU s / round | server share | "
              "chunks (largest) | peak GPU MB / chunk | final acc | ARI | clusters |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        if "error" in r:
            lines.append(f"| {r['clients']} | {r['strategy']} | {r['client_batching']} | {r['error']} |||||||||")
            continue
        lines.append(f"| {r['clients']} | {r['strategy']} | {r['client_batching']} | {r['steady_round_seconds']} | "
                     f"{r['clients_per_second']} | {r['cpu_seconds_per_round']} | {r['server_share']} | "
                     f"{r['chunks']} ({r['largest_chunk']}) | {r['peak_gpu_bytes_per_chunk'] / 2**20:.0f} | "
                     f"{r['final_accuracy']:.4f} | {r['final_ari']:.2f} | {r['num_clusters']} |")
    lines += ["", "Speed-up (sequential steady round / batched steady round, same clients and strategy): "
              + ", ".join(f"{k}: {v}" for k, v in data["speedup"].items()), ""]
    differ = modes_disagree(data["results"])
    if differ:
        lines += ["The two modes ended with different clusters: " + ", ".join(differ) + ". Trained together, a client's "
                  "weights differ from one-after-another training by rounding (on a GPU, other kernels too), and a "
                  "clustering decision close to its threshold can fall the other way; each run's round lines say which "
                  "(NOTES.md, where present).", ""]
    (folder / "README.md").write_text("\n".join(lines) + "\n")


def mode_pairs(results: list[dict]) -> list[tuple[dict, dict]]:
    """(one after another, trained together) for each batched run that has a sequential twin
    (same clients and strategy), runs that failed left out."""
    pairs = []
    for r in results:
        if r["client_batching"] != "auto" or "error" in r:
            continue
        off = [o for o in results if o["client_batching"] == "off" and o["clients"] == r["clients"]
               and o["strategy"] == r["strategy"] and "error" not in o]
        if off:
            pairs.append((off[0], r))
    return pairs


def modes_disagree(results: list[dict]) -> list[str]:
    """``strategy-clients (off: k, auto: k)`` for each pair of runs whose cluster counts or ARI differ."""
    out = []
    for off, r in mode_pairs(results):
        if off["num_clusters"] != r["num_clusters"] or abs(off["final_ari"] - r["final_ari"]) > 1e-9:
            k_off, k_auto = off["num_clusters"], r["num_clusters"]
            out.append(f"{r['strategy']}-{r['clients']} (off: {k_off} cluster{'s' * (k_off != 1)}, ARI "
                       f"{off['final_ari']:.2f}; auto: {k_auto} cluster{'s' * (k_auto != 1)}, ARI {r['final_ari']:.2f})")
    return out


def speedups(results: list[dict]) -> dict[str, float]:
    return {f"{r['strategy']}-{r['clients']}": round(off["steady_round_seconds"] / r["steady_round_seconds"], 2)
            for off, r in mode_pairs(results)}


def main() -> int:
    from clusterfed.experiments.manifest import start_manifest, write_manifest
    from clusterfed.experiments.settings import default_data_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="100,1000")
    parser.add_argument("--strategies", default="fedavg,fedclust,cfl")
    parser.add_argument("--modes", default="off,auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--label", default="", help="results subfolder (default: gpu with CUDA, else cpu)")
    parser.add_argument("--server-parts", action="store_true",
                        help="instead: the seconds per round of each server part, clients trained together "
                             "(server_parts.json in the results folder)")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    import torch

    label = args.label or ("gpu" if torch.cuda.is_available() else "cpu")
    folder = RESULTS / label
    manifest = start_manifest(vars(args))
    if args.server_parts:
        rows = [server_profile(int(n), strategy, args.rounds, args.data_dir) for n in args.clients.split(",")
                for strategy in args.strategies.split(",")]
        for row in rows:
            print(json.dumps(row), flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "server_parts.json").write_text(json.dumps({"device": device_name(), "rows": rows}, indent=1) + "\n")
        main_manifest = folder / "manifest.json"
        kept = main_manifest.read_text() if main_manifest.exists() else None  # the timing runs' own
        write_manifest(folder, manifest, device=device_name()).rename(folder / "manifest-server-parts.json")
        if kept is not None:
            main_manifest.write_text(kept)
        return 0
    data = {"command": "PYTHONPATH=$PWD python benchmarks/" + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "device": device_name(), "results": []}
    for clients in [int(c) for c in args.clients.split(",")]:
        for strategy in args.strategies.split(","):
            for mode in args.modes.split(","):
                try:
                    row = run_once(clients, strategy, mode, args.rounds, args.data_dir)
                except Exception as error:  # noqa: BLE001 - a run that fails is a result too
                    row = {"clients": clients, "strategy": strategy, "client_batching": mode,
                           "error": f"{type(error).__name__}: {error}"[:300]}
                data["results"].append(row)
                print(json.dumps(row), flush=True)
                data["speedup"] = speedups(data["results"])
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "results.json").write_text(json.dumps(data, indent=1) + "\n")
                write_readme(folder, data)
                write_manifest(folder, manifest, device=data["device"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
