"""Run a grid of (strategy × setting × seed) simulations and write a results table.

    python benchmarks/archive/scripts/grid.py --name fedavg_baseline --strategies fedavg \
        --settings shards,rotation,label-swap --seeds 0 --rounds 30 [--set key=value ...]

Runs with the in-process engine (same apps as Flower's simulation engine, no Ray; see
clusterfed/simulation.py) and writes, under benchmarks/results/<name>/:
``results.json`` (one row per run: summary fields), ``table.md`` (mean ± std over seeds)
and ``command.txt`` (the command that made them). Each run's folder is kept in
``runs/`` beside them (git-ignored) for figures.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from clusterfed.config import parse_config, parse_overrides  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402

# The named non-IID settings used across the benchmarks (digits, 20 clients).
SETTINGS: dict[str, dict[str, object]] = {
    "iid": {"partitioner": "iid"},
    "shards": {"partitioner": "shards"},
    "label-groups": {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5;6,7;8,9"},
    "label-groups-4": {"partitioner": "label-groups", "label-groups": "0-3;3-6;4-9;0-9"},
    "rotation": {"partitioner": "rotation", "rotations": "0,90,180,270"},
    "rotation-2": {"partitioner": "rotation", "rotations": "0,180"},
    "label-swap": {"partitioner": "label-swap", "num-groups": 4},
    "dominant": {"partitioner": "dominant", "num-groups": 4, "alpha": 0.7},
}

FIELDS = ("final_accuracy", "best_accuracy", "final_ari", "num_clusters", "final_clustering_round", "rounds_to_target",
          "mb_to_target", "total_mb", "total_mb_up", "wall_seconds")


def mean_std(values: list) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    if len(present) < len(values):
        suffix = f" ({len(present)}/{len(values)})"
    else:
        suffix = ""
    array = np.array(present, dtype=float)
    if len(array) == 1:
        return f"{array[0]:.3g}{suffix}"
    std = array.std()
    if std <= 1e-9 * max(abs(array.mean()), 1.0):  # equal up to float summation order
        std = 0.0
    return f"{array.mean():.3g} ± {std:.2g}{suffix}"


def write_table(rows: list[dict], path: Path, fields=FIELDS) -> str:
    keys = sorted({(r["setting"], r["strategy"]) for r in rows}, key=lambda k: (k[0], k[1]))
    lines = ["| setting | strategy | " + " | ".join(fields) + " |", "|---|---|" + "---|" * len(fields)]
    for setting, strategy in keys:
        group = [r for r in rows if r["setting"] == setting and r["strategy"] == strategy]
        cells = [mean_std([r.get(f) for r in group]) for f in fields]
        lines.append(f"| {setting} | {strategy} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--strategies", required=True, help="comma-separated; NAME:key=value+key=value for variants")
    parser.add_argument("--settings", required=True, help=f"comma-separated from {', '.join(SETTINGS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)

    out = ROOT / "results" / args.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text("python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]]) + "\n")
    rows: list[dict] = []
    results_path = out / "results.json"
    for setting in args.settings.split(","):
        for variant in args.strategies.split(","):
            name, _, extra = variant.partition(":")
            extra_values = parse_overrides([p for p in extra.split("+") if p])
            for seed in [int(s) for s in args.seeds.split(",")]:
                values = {"num-clients": 20, "rounds": args.rounds, "seed": seed, **SETTINGS[setting],
                          **parse_overrides(args.overrides), **extra_values, "strategy": name,
                          "out-dir": str(out / "runs" / f"{setting}__{variant.replace(':', '_')}__s{seed}")}
                config = parse_config(values)
                started = time.perf_counter()
                summary = simulate(config, engine="inprocess", stream=None)
                # the round of the last split (splitting strategies write it to clusters.json)
                clusters_path = Path(config.out_dir) / "clusters.json"
                clusters = json.loads(clusters_path.read_text()) if clusters_path.exists() else {}
                row = {"setting": setting, "strategy": variant, "seed": seed,
                       **{k: summary.get(k) for k in FIELDS}, "extra": summary.get("extra", {}),
                       "final_clustering_round": clusters.get("final_clustering_round")}
                rows.append(row)
                print(f"{setting:>14} {variant:>28} seed {seed}: acc {summary['final_accuracy']:.3f} "
                      f"ARI {summary['final_ari']:.2f} clusters {summary['num_clusters']} "
                      f"({time.perf_counter() - started:.0f}s)", flush=True)
                results_path.write_text(json.dumps(rows, indent=1))
    print(write_table(rows, out / "table.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
