"""Engine overhead of an in-process round: round time / the clients' own compute.

    PYTHONPATH=$PWD python benchmarks/bench_engine_overhead.py inprocess [--clients 20,100] [--rounds 5]
    PYTHONPATH=$PWD python benchmarks/bench_engine_overhead.py profile --clients 20 [--rounds 3]   # cProfile, top functions
    PYTHONPATH=$PWD python benchmarks/bench_engine_overhead.py flower [--clients 20,100] [--rounds 5]
    PYTHONPATH=$PWD python benchmarks/bench_engine_overhead.py clustered [--clients 20] [--rounds 10]

``inprocess``: FedAvg on digits (iid, so 100 clients fit), in-process engine. The floor of a
round is what the clients compute themselves: ``clusterfed.training.train`` and
``evaluate`` (timed by wrapping them where the ClientApp calls them). Overhead = the sum of
``round_seconds`` / the sum of that client compute, over all rounds after the first (round
1 also builds the partition and warms caches). Goal ≤ 1.15.

``flower``: ``fedavg`` vs ``flwr-fedavg`` (Flower's own FedAvg) on Flower's simulation
engine (Ray), same seeds: wall-time ratio (goal ≤ 1.05) and the largest per-round accuracy
difference.

``clustered``: mean round time of each clustered strategy over ``fedavg``'s, same setting
(digit pairs), in-process (goal: ≤ 10 % extra per round). Rounds that run an extra
clustering phase (FedClust's clustering round, IFCA's K-model downlink) are reported as
they are.

Every mode writes ``benchmarks/results/engine_overhead.json`` (one entry per mode, merged).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent

OUT = ROOT / "results" / "engine_overhead.json"


def _config(strategy: str, clients: int, rounds: int, out: str, **extra):
    from clusterfed.config import parse_config

    from clusterfed.experiments.settings import setting

    values = {**setting("digits-iid"), "strategy": strategy, "num-clients": clients, "rounds": rounds, "seed": 0,
              "checkpoint": False, "out-dir": out, **extra}
    return parse_config(values)


class ClientClock:
    """Wraps the ClientApp's train/evaluate calls and sums their wall time per call."""

    def __init__(self):
        import clusterfed.client_app as client_app

        self.module = client_app
        self.originals = {"train": client_app.train, "evaluate": client_app.evaluate}
        self.seconds = 0.0
        self.calls = 0

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        return timed

    def __enter__(self):
        for name, fn in self.originals.items():
            setattr(self.module, name, self._wrap(fn))
        return self

    def __exit__(self, *exc):
        for name, fn in self.originals.items():
            setattr(self.module, name, fn)


@contextlib.contextmanager
def marking_rounds(clock: ClientClock):
    """While open, every round the recorder records appends (client seconds, calls) so far
    to the yielded list: the client compute of round r is the difference of two marks."""
    import clusterfed.results as results

    marks: list[tuple[float, int]] = []
    original = results.RunRecorder.record_round

    def record_round(self, *args, **kwargs):
        marks.append((clock.seconds, clock.calls))
        return original(self, *args, **kwargs)

    results.RunRecorder.record_round = record_round
    try:
        yield marks
    finally:
        results.RunRecorder.record_round = original


def measure_inprocess(clients: int, rounds: int) -> dict:
    """Per round: round_seconds and the clients' train + evaluate seconds."""
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp, ClientClock() as clock, marking_rounds(clock) as marks:
        config = _config("fedavg", clients, rounds, tmp)
        started = time.perf_counter()
        simulate(config, engine="inprocess", stream=None)
        wall = time.perf_counter() - started
        rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    return overhead_record(rows, marks, clients, rounds, wall)


def overhead_record(rows: list[dict], marks: list[tuple[float, int]], clients: int, rounds: int, wall: float,
                    keys: tuple[str, ...] = ()) -> dict:
    """Round time / client compute over the rounds after the first (round 1 builds the
    partition and warms caches), with the per-round figures (``keys``: more rounds.jsonl fields)."""
    per_round, previous = [], (0.0, 0)
    for row, (seconds, calls) in zip(rows, marks):
        per_round.append({"round": row["round"], "round_seconds": row["round_seconds"],
                          "client_seconds": round(seconds - previous[0], 4), "client_calls": calls - previous[1],
                          **{k: row.get(k) for k in keys}})
        previous = (seconds, calls)
    later = per_round[1:] or per_round
    round_sum = sum(r["round_seconds"] for r in later)
    client_sum = sum(r["client_seconds"] for r in later)
    return {"clients": clients, "rounds": rounds, "wall_seconds": round(wall, 2),
            "overhead": round(round_sum / client_sum, 3), "round_seconds_mean": round(round_sum / len(later), 3),
            "client_seconds_mean": round(client_sum / len(later), 3), "per_round": per_round}


def profile(clients: int, rounds: int, top: int = 25) -> str:
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp:  # imports and caches first, outside the profile
        simulate(_config("fedavg", clients, 1, tmp), engine="inprocess", stream=None)
    with tempfile.TemporaryDirectory() as tmp:
        config = _config("fedavg", clients, rounds, tmp)
        profiler = cProfile.Profile()
        profiler.enable()
        simulate(config, engine="inprocess", stream=None)
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("clusterfed|flwr|copy", top * 2)
    return stream.getvalue()


def measure_flower(clients: int, rounds: int, seed: int) -> dict:
    from clusterfed.simulation import simulate

    out = {}
    for strategy in ("fedavg", "flwr-fedavg"):
        with tempfile.TemporaryDirectory() as tmp:
            config = _config(strategy, clients, rounds, tmp, seed=seed)
            started = time.perf_counter()
            simulate(config, engine="flower", stream=None)
            wall = time.perf_counter() - started
            rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
        out[strategy] = {"wall_seconds": round(wall, 2), "accuracy": [r["accuracy"] for r in rows],
                         "round_seconds": [r["round_seconds"] for r in rows]}
    diff = max(abs(a - b) for a, b in zip(out["fedavg"]["accuracy"], out["flwr-fedavg"]["accuracy"]))
    return {"clients": clients, "rounds": rounds, "seed": seed,
            "wall_ratio": round(out["fedavg"]["wall_seconds"] / out["flwr-fedavg"]["wall_seconds"], 3),
            "round_time_ratio_after_round_1": round(sum(out["fedavg"]["round_seconds"][1:])
                                                    / sum(out["flwr-fedavg"]["round_seconds"][1:]), 3),
            "max_accuracy_difference": diff, "runs": out}


def measure_clustered(clients: int, rounds: int, strategies: list[str]) -> dict:
    from clusterfed.simulation import simulate

    from clusterfed.experiments.settings import setting

    pairs = setting("digits-pairs")
    out = {}
    for strategy in ["fedavg", *strategies]:
        with tempfile.TemporaryDirectory() as tmp:
            simulate(_config(strategy, clients, rounds, tmp, **pairs), engine="inprocess", stream=None)
            rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
        seconds = [r["round_seconds"] for r in rows]
        out[strategy] = {"round_seconds_median": round(statistics.median(seconds), 4),
                         "round_seconds_mean": round(statistics.mean(seconds), 4),
                         "clustering_seconds_total": round(sum(r["clustering_seconds"] for r in rows), 4)}
    base = out["fedavg"]["round_seconds_median"]
    for strategy, entry in out.items():
        entry["extra_over_fedavg_median"] = round(entry["round_seconds_median"] / base - 1, 3)
        entry["extra_over_fedavg_mean"] = round(entry["round_seconds_mean"] / out["fedavg"]["round_seconds_mean"] - 1, 3)
    return {"clients": clients, "rounds": rounds, "setting": setting, "strategies": out}


def save(mode: str, entry: dict) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    entry = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
             "load_average_at_end": [round(x, 2) for x in os.getloadavg()], **entry}
    if "results" in entry and mode in data:  # keep the other client counts' earlier measurements
        counts = {r["clients"] for r in entry["results"]}
        kept = [r | {"command": data[mode]["command"]} for r in data[mode].get("results", []) if r["clients"] not in counts]
        entry["results"] = sorted(kept + entry["results"], key=lambda r: r["clients"])
    data[mode] = entry
    OUT.write_text(json.dumps(data, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("inprocess", "profile", "flower", "clustered"))
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", default="fedclust,adacfl,cfl,layercfl,hicfl,ifca,oracle")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    if args.mode == "profile":
        text = profile(clients[0], args.rounds)
        print(text)
        (ROOT / "results" / f"engine_profile_{clients[0]}.txt").write_text(text)
        return 0
    if args.mode == "inprocess":
        results = [measure_inprocess(c, args.rounds) for c in clients]
        for r in results:
            print(f"{r['clients']} clients: round {r['round_seconds_mean']:.3f} s, client compute "
                  f"{r['client_seconds_mean']:.3f} s, overhead {r['overhead']:.3f}")
        save("inprocess", {"results": results})
    elif args.mode == "flower":
        results = [measure_flower(c, args.rounds, args.seed) for c in clients]
        for r in results:
            print(f"{r['clients']} clients: wall fedavg / flwr-fedavg {r['wall_ratio']:.3f}, per-round after round 1 "
                  f"{r['round_time_ratio_after_round_1']:.3f}, max |Δ accuracy| {r['max_accuracy_difference']:.2g}")
        save("flower", {"results": results})
    else:
        result = measure_clustered(clients[0], args.rounds, args.strategies.split(","))
        for strategy, entry in result["strategies"].items():
            print(f"{strategy:>10}: median round {entry['round_seconds_median']:.3f} s "
                  f"({entry['extra_over_fedavg_median']:+.1%} over fedavg), mean {entry['round_seconds_mean']:.3f} s "
                  f"({entry['extra_over_fedavg_mean']:+.1%})")
        save("clustered", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
