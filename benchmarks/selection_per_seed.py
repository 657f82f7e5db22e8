"""Client selection with its defaults against FedAvg, seed by seed, on the client-selection
paper's setting (8 clients, four digit pairs, 60 rounds, in-process): does every seed hold on its
own (within 2 pp of FedAvg's final accuracy at no more than 60 % of its transmissions)?

    PYTHONPATH=$PWD nice -n 15 python benchmarks/selection_per_seed.py run --out DIR --jobs floor-none:4,fedavg:4
    python benchmarks/selection_per_seed.py collect --out DIR [--fedavg-from OTHER/comparison.csv]
    python benchmarks/selection_guard_summary.py DIR

``run`` runs each ``label:seed`` job missing under DIR/grid/<label>/seed<s> (labels: ``fedavg``,
``floor-<stabilizer>``: selection's defaults with that stabiliser; ``budget58-``, ``latest-``,
``latest-budget58-<stabilizer>``: the opt-in trials of ``VARIANTS``), one thread each; several
``run`` processes may share a DIR (a job whose folder exists is left to its owner). ``collect``
writes DIR/grid/comparison.csv (strategy, seed, final accuracy, transmissions, warm-up rounds,
the floor) from the finished runs; ``--fedavg-from`` takes FedAvg's rows for the seeds DIR lacks
from an earlier comparison.csv of the same setting and rounds (FedAvg's code unchanged since).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

SETTING, ROUNDS, GRID = "digits-four-pairs-8", 60, "selection-per-seed-8-60"
FIELDS = ("strategy", "seed", "final_accuracy", "last10_accuracy", "transmissions", "warmup_rounds", "full_rounds",
          "p_floor", "rounds", "source")
LAST = 10  # last10_accuracy: the mean accuracy of the last LAST rounds (the final round's is one draw of a noisy curve)


VARIANTS = {  # label prefix -> selection's keys beyond its defaults (opt-in trials)
    "floor": {},
    "budget58": {"selection.budget": 0.58},
    "latest": {"selection.group-step": "latest", "selection.draw": "oldest"},
    "latest-budget58": {"selection.group-step": "latest", "selection.draw": "oldest", "selection.budget": 0.58},
}


def values(label: str) -> dict:
    """A job label's run config: ``fedavg``, or ``<variant>-<stabilizer>`` (``VARIANTS``)."""
    if label == "fedavg":
        return {"strategy": "fedavg"}
    variant, stabilizer = label.rsplit("-", 1)
    return {"strategy": "selection", "selection.stabilizer": stabilizer, **VARIANTS[variant]}


def run(out: Path, jobs: list[tuple[str, int]]) -> None:
    import torch

    from clusterfed.config import parse_config
    from clusterfed.experiments import settings as registry
    from clusterfed.simulation import simulate

    torch.set_num_threads(1)
    for label, seed in jobs:
        folder = out / GRID / label / f"seed{seed}"
        if folder.exists():
            continue
        started = time.time()
        config = {**registry.setting(SETTING), "rounds": ROUNDS, "seed": seed, "out-dir": str(folder),
                  "checkpoint": False, **values(label)}
        simulate(parse_config(config), engine="inprocess", stream=None)
        print(f"{label} seed {seed}: {row(folder, label, seed)} ({time.time() - started:.0f} s)", flush=True)


def row(folder: Path, label: str, seed: int) -> dict | None:
    """One finished run's line of comparison.csv (None: not finished)."""
    path = folder / "rounds.jsonl"
    rounds = [json.loads(line) for line in open(path)] if path.exists() else []
    if len(rounds) < ROUNDS:
        return None
    return {"strategy": label, "seed": seed, "final_accuracy": rounds[-1]["accuracy"],
            "last10_accuracy": sum(r["accuracy"] for r in rounds[-LAST:]) / LAST,
            "transmissions": sum(r["transmissions"] for r in rounds),
            "warmup_rounds": sum(1 for r in rounds if r.get("warmup")),
            "full_rounds": sum(1 for r in rounds if r.get("full_round")), "p_floor": rounds[-1].get("p_floor"),
            "rounds": len(rounds), "source": "this run"}


def collect(out: Path, fedavg_from: Path | None) -> Path:
    rows = []
    for label_dir in sorted(p for p in (out / GRID).iterdir() if p.is_dir()):
        for seed_dir in sorted(label_dir.glob("seed*"), key=lambda p: int(p.name[4:])):
            found = row(seed_dir, label_dir.name, int(seed_dir.name[4:]))
            if found:
                rows.append(found)
    if fedavg_from is not None:
        have = {r["seed"] for r in rows if r["strategy"] == "fedavg"}
        with open(fedavg_from, newline="") as handle:
            for r in csv.DictReader(handle):
                if r["strategy"] == "fedavg" and int(r["seed"]) not in have and int(r["rounds"]) == ROUNDS:
                    rows.append({"strategy": "fedavg", "seed": int(r["seed"]), "final_accuracy": float(r["final_accuracy"]),
                                 "last10_accuracy": r.get("last10_accuracy", ""), "transmissions": int(r["transmissions"]),
                                 "warmup_rounds": "", "full_rounds": "", "p_floor": "",
                                 "rounds": ROUNDS, "source": str(fedavg_from)})
    path = out / GRID / "comparison.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["strategy"], r["seed"])))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("run", "collect"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", default="", help="label:seed,... (run)")
    parser.add_argument("--fedavg-from", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "run":
        run(args.out, [(job.split(":")[0], int(job.split(":")[1])) for job in args.jobs.split(",") if job])
    else:
        print(collect(args.out, args.fedavg_from))


if __name__ == "__main__":
    main()
