"""What each run of an experiment's grids said about its cluster count, as plain JSON.

For every grid folder below an experiment's results (``<out>/<folder>/<label>/seed<s>/``, the
per-run folders are not committed), ``<out>/<folder>/reasons.json``: per strategy label and
seed, the final ARI and number of clusters, the run's ``one_cluster_reason`` and its miss
reasons (summary.json), ``cluster_count_basis`` (clusters.json), and ``purity``: the share of
the clients whose cluster's most common true group is their own (1.0 for an over-split of pure
clusters, where ARI falls). Covered by
the grid's manifest.json, which the experiment runner wrote. Rows of runs whose folders are
gone (seeds run earlier, elsewhere) are kept.

    python benchmarks/cluster_count_reasons.py benchmarks/results/scale-cfl-family
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sklearn.metrics.cluster import contingency_matrix

from clusterfed.cluster_misses import MISS_LABELS

KEYS = ("final_ari", "num_clusters", "final_accuracy", "one_cluster_reason", *MISS_LABELS)


def purity(assignment: dict[str, int], true_groups: dict[str, int]) -> float | None:
    """The share of clients whose cluster's most common true group is their own (None without groups)."""
    keys = [k for k in assignment if k in true_groups]
    if not keys:
        return None
    table = contingency_matrix([true_groups[k] for k in keys], [assignment[k] for k in keys])
    return float(table.max(axis=0).sum() / len(keys))


def reasons(grid: Path) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for summary_path in sorted(grid.glob("*/seed*/summary.json")):
        run = summary_path.parent
        summary = json.loads(summary_path.read_text())
        clusters_path = run / "clusters.json"
        clusters = json.loads(clusters_path.read_text()) if clusters_path.exists() else {}
        row = {key: summary.get(key) for key in KEYS}
        row["cluster_count_basis"] = clusters.get("cluster_count_basis")
        row["purity"] = purity(clusters.get("assignment") or {}, clusters.get("true_groups") or {})
        out.setdefault(run.parent.name, {})[run.name] = row
    return out


def main(results: str) -> None:
    for grid in sorted(p for p in Path(results).iterdir() if p.is_dir()):
        found = reasons(grid)
        if found:
            path = grid / "reasons.json"
            # runs whose folders are gone (not committed) keep their rows: merge, do not replace
            kept = json.loads(path.read_text()) if path.exists() else {}
            for label, seeds in found.items():
                kept.setdefault(label, {}).update(seeds)
            path.write_text(json.dumps(kept, indent=1) + "\n")
            print(f"wrote {grid / 'reasons.json'}")


if __name__ == "__main__":
    main(sys.argv[1])
