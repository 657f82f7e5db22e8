"""What each run of an experiment's grids said about its cluster count, as plain JSON.

For every grid folder below an experiment's results (``<out>/<folder>/<label>/seed<s>/``, the
per-run folders are not committed), ``<out>/<folder>/reasons.json``: per strategy label and
seed, the final ARI and number of clusters, and the run's ``one_cluster_reason``,
``over_split_reason`` (summary.json) and ``cluster_count_basis`` (clusters.json). Covered by
the grid's manifest.json, which the experiment runner wrote.

    python benchmarks/cluster_count_reasons.py benchmarks/results/scale-cfl-family
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("final_ari", "num_clusters", "final_accuracy", "one_cluster_reason", "over_split_reason",
        "under_split_reason", "mixed_clusters_reason")


def reasons(grid: Path) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for summary_path in sorted(grid.glob("*/seed*/summary.json")):
        run = summary_path.parent
        summary = json.loads(summary_path.read_text())
        clusters_path = run / "clusters.json"
        clusters = json.loads(clusters_path.read_text()) if clusters_path.exists() else {}
        row = {key: summary.get(key) for key in KEYS}
        row["cluster_count_basis"] = clusters.get("cluster_count_basis")
        out.setdefault(run.parent.name, {})[run.name] = row
    return out


def main(results: str) -> None:
    for grid in sorted(p for p in Path(results).iterdir() if p.is_dir()):
        found = reasons(grid)
        if found:
            (grid / "reasons.json").write_text(json.dumps(found, indent=1) + "\n")
            print(f"wrote {grid / 'reasons.json'}")


if __name__ == "__main__":
    main(sys.argv[1])
