"""IFCA and adaptive cluster-count client selection on digits, in-process, one run at a time.

    PYTHONPATH=$PWD python benchmarks/bench_ifca_selection.py selection --rounds 200 --seeds 0,1,2 --out results/bench_sel
    PYTHONPATH=$PWD python benchmarks/bench_ifca_selection.py ifca --rounds 30 --seeds 0 --out results/bench_ifca

``selection``: the client-selection paper's setting (8 clients, a pair of digits per two
clients), selection with each stabilizer against FedAvg: final accuracy and total
transmissions (client replies) and MB. ``ifca``: IFCA against FedClust and CFL on 20
clients, digit pairs / label-swap / rotation: final accuracy, ARI, MB downloaded.
Prints one markdown table; every run's folder stays under --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from clusterfed.config import parse_config
from clusterfed.experiments import settings as registry
from clusterfed.experiments.stats import mean_std
from clusterfed.simulation import simulate

SELECTION = {"fedavg": {"strategy": "fedavg"}} | {
    f"selection/{s}": {"strategy": "selection", "stabilizer": s} for s in ("none", "annealing", "experience")}
SELECTION_DATA = {**registry.setting("digits-four-pairs-8"), "warmup-rounds": 2}
# IFCA's comparisons: (table name, registered setting), 20 clients, IFCA with 4 clusters
IFCA_SETTINGS = (("digit pairs", "digits-four-pairs"), ("label-swap", "digits-label-swap"),
                 ("rotation", "digits-rotation"))
IFCA = ("ifca", "fedclust", "cfl")


def run(values: dict, out: Path) -> dict:
    config = parse_config({**values, "out-dir": str(out), "checkpoint": False})
    simulate(config, engine="inprocess", stream=None)
    return stats(out)


def stats(out: Path, target: float = 0.95) -> dict:
    """What one run's rounds.jsonl says: final numbers, and the round and the replies
    (transmissions) it took to first reach ``target`` accuracy."""
    rounds = [json.loads(line) for line in open(out / "rounds.jsonl")]
    last = rounds[-1]
    sent, to_target = 0, (None, None)
    for r in rounds:
        sent += r["transmissions"]
        if r["accuracy"] is not None and r["accuracy"] >= target and to_target[0] is None:
            to_target = (r["round"], sent)
    ps = [r["p"] for r in rounds if r.get("p") is not None]
    return {"accuracy": last["accuracy"], "ari": last["ari"], "mb_down": last["cum_bytes_down"] / 1e6,
            "mb_total": (last["cum_bytes_down"] + last["cum_bytes_up"]) / 1e6,
            "transmissions": sent, "final_p": last.get("p"), "mean_p": float(np.mean(ps)) if ps else None,
            "last20_accuracy": float(np.mean([r["accuracy"] for r in rounds[-20:]])),
            "round_to_target": to_target[0], "transmissions_to_target": to_target[1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=("selection", "ifca"))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="results/bench_ifca_selection")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    rows = []
    if args.which == "selection":
        cases = [(name, "pairs", {**SELECTION_DATA, **values}) for name, values in SELECTION.items()]
    else:
        cases = [(name, table_name, {**registry.setting(setting), "num-clusters": 4, "strategy": name})
                 for table_name, setting in IFCA_SETTINGS for name in IFCA]
    for name, setting, values in cases:
        results = [run({**values, "rounds": args.rounds, "seed": seed},
                       out / setting.replace(" ", "-") / name.replace("/", "-") / f"seed{seed}") for seed in seeds]
        mean = {k: float(np.mean([r[k] for r in results])) for k in ("accuracy", "ari", "mb_down", "mb_total",
                                                                     "transmissions")}
        accuracy = mean_std(r["accuracy"] for r in results).format(3)
        rows.append(f"| {setting} | {name} | {accuracy} | {mean['ari']:.2f} | "
                    f"{mean['transmissions']:.0f} | {mean['mb_down']:.1f} | {mean['mb_total']:.1f} | "
                    f"{[r['final_p'] for r in results]} |")
        print(rows[-1], flush=True)
    print("| setting | strategy | final accuracy (mean ± std over seeds) | ARI | transmissions (replies) | "
          "MB down | MB up+down | final p |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def report(folders: list[str]) -> None:
    """Per-run lines for run folders written earlier (``python ... report DIR ...``)."""
    print("| run | final acc | mean acc, last 20 rounds | replies | round to 0.95 | replies to 0.95 | mean p |")
    print("|---|---|---|---|---|---|---|")
    for folder in folders:
        s = stats(Path(folder))
        mean_p = "–" if s["mean_p"] is None else f"{s['mean_p']:.2f}"
        print(f"| {folder} | {s['accuracy']:.3f} | {s['last20_accuracy']:.3f} | {s['transmissions']} | "
              f"{s['round_to_target']} | {s['transmissions_to_target']} | {mean_p} |")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["report"]:
        report(sys.argv[2:])
    else:
        main()
