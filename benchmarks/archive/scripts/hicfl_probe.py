"""Probe HiCFL's splits on one digits setting: each split's round, layer, sizes and the
true groups on each side (for measuring changes to the split rule; not a results table).

    python benchmarks/archive/scripts/hicfl_probe.py --setting rotation --seed 0 --rounds 50 [--set key=value ...] [--raw]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from benchmarks.grid import SETTINGS  # noqa: E402
from clusterfed.config import parse_config, parse_overrides  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402
from clusterfed.strategies import hicfl  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setting", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--raw", action="store_true", help="the paper's raw cosine sign (no centring)")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", default="/tmp/hicfl_probe")
    a = p.parse_args()
    hicfl.HiCFL.centre_updates = not a.raw
    tag = f"{a.setting}_s{a.seed}_{'raw' if a.raw else 'centred'}_{'_'.join(a.overrides)}".replace("=", "-")
    values = {"num-clients": 20, "rounds": a.rounds, "seed": a.seed, **SETTINGS[a.setting],
              **parse_overrides(a.overrides), "strategy": "hicfl", "out-dir": f"{a.out}/{tag}"}
    config = parse_config(values)
    summary = simulate(config, engine="inprocess", stream=None)
    clusters = json.loads((Path(config.out_dir) / "clusters.json").read_text())
    print(f"== {tag}: acc {summary['final_accuracy']:.3f} ARI {summary['final_ari']:.2f} "
          f"clusters {summary['num_clusters']} final_round {clusters['final_clustering_round']}")
    truth = clusters.get("true_groups") or {}
    for s in clusters["splits"]:
        sides = [Counter(truth.get(k, "?") for k in side) for side in s["members"]]
        print(f"  r{s['round']} parent {s['parent']} layer {s['layer']} ref {s['reference']} "
              f"sides {[len(m) for m in s['members']]} groups {[dict(c) for c in sides]} members {s['members']}")
    reasons = Counter((n["cluster"], n["reason"]) for n in clusters.get("no_split", []))
    print("  no_split:", dict(reasons))


if __name__ == "__main__":
    main()
