"""IFCA's re-seeding against the paper's rule (a model nobody chooses keeps its weights) on
digits, 12 clients in 3 label-swap groups, K = 3, 20 rounds, in-process, one run per seed and rule.

    PYTHONPATH=$PWD nice -n 15 python benchmarks/ifca_reseed.py --seeds 6 --out benchmarks/results/ifca-reseed

Writes ``summary.json`` (per rule and seed: final accuracy, ARI, clusters, the re-seeds and the
last round line's ending) and ``manifest.json`` into ``--out``; the run folders go to ``--runs``
(default: a temporary folder, not kept).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from clusterfed.config import parse_config
from clusterfed.experiments.manifest import start_manifest, write_manifest
from clusterfed.experiments.settings import setting
from clusterfed.simulation import simulate

CASE = {**setting("digits-label-swap3-12"), "strategy": "ifca", "rounds": 20, "ifca.num-clusters": 3,
        "checkpoint": False}
RULES = {"paper": 0, "default": 2}  # reseed-after: 0 is the paper preset's, 2 the default


def one(seed: int, reseed_after: int, folder: Path) -> dict:
    simulate(parse_config({**CASE, "seed": seed, "ifca.reseed-after": reseed_after, "out-dir": str(folder)}),
             engine="inprocess", stream=None)
    rounds = [json.loads(line) for line in open(folder / "rounds.jsonl")]
    last = rounds[-1]
    return {"seed": seed, "reseed_after": reseed_after, "final_accuracy": last["accuracy"], "ari": last["ari"],
            "clusters": last["num_clusters"], "choices_per_round": [r.get("ifca_choices") for r in rounds],
            "reseeds": [dict(r["ifca_reseed"], round=r["round"]) for r in rounds if r.get("ifca_reseed")]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="6")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=Path, default=None)
    args = parser.parse_args()
    manifest = start_manifest(CASE)
    runs = args.runs or Path(tempfile.mkdtemp(prefix="ifca-reseed-"))
    summary = {"case": CASE, "rules": {}}
    for name, reseed_after in RULES.items():
        summary["rules"][name] = {}
        for seed in (int(s) for s in args.seeds.split(",")):
            result = one(seed, reseed_after, runs / f"reseed{reseed_after}" / f"seed{seed}")
            summary["rules"][name][str(seed)] = result
            print(name, seed, result["final_accuracy"], result["ari"], result["clusters"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_manifest(args.out, manifest)


if __name__ == "__main__":
    main()
