"""Merge the results of several grid runs into one table (mean ± std over seeds).

    python benchmarks/archive/scripts/merge.py --out benchmarks/archive/results/bipartition_table.md \
        benchmarks/archive/results/cfl_bestcut_a benchmarks/archive/results/hicfl_vs_cfl=hicfl-v2: ...

Each argument is a grid folder (holding ``results.json``); ``FOLDER=PREFIX`` prefixes that
folder's strategy names (to tell versions of one strategy apart), ``FOLDER@a,b`` keeps only
those strategies. Rows are grouped by (setting, strategy) as in ``grid.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from benchmarks.grid import write_table  # noqa: E402

TABLE_FIELDS = ("final_accuracy", "best_accuracy", "final_ari", "num_clusters", "final_clustering_round",
                "rounds_to_target", "total_mb_up")


def load(spec: str) -> list[dict]:
    spec, _, keep = spec.partition("@")
    folder, _, prefix = spec.partition("=")
    rows = json.loads((Path(folder) / "results.json").read_text())
    if keep:
        rows = [r for r in rows if r["strategy"] in keep.split(",")]
    return [{**r, "strategy": prefix + r["strategy"]} for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="FOLDER[=PREFIX][@strategy,strategy]")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = [row for spec in args.folders for row in load(spec)]
    print(write_table(rows, Path(args.out), TABLE_FIELDS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
