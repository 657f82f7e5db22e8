"""Summarise benchmarks/results/scale-adacfl/: per grid folder, AdaCFL's final ARI, cluster count
and accuracy (mean ± std over seeds) beside the oracle's and FedAvg's, and beside AdaCFL's row in
benchmarks/results/scale/ (the same grid with the paper's union of the pre-clusters' cuts and the
best-silhouette λ, the code before precluster-merge and auto-tolerance); per AdaCFL run, the
clustering step's evidence from its clusters.json (pre-clusters, clusters inside them and after
the merge, the best and the chosen auto cut, λ, the one-cluster reason).

    python benchmarks/adacfl_scale_summary.py [benchmarks/results/scale-adacfl]

Reads each grid folder's comparison.csv and the AdaCFL run folders beside it (run this where the
experiment ran: the run folders are not committed); the oracle and FedAvg come from
benchmarks/results/scale/<grid>/ where the grid folder has none. Writes summary.json and
summary.md beside the grid folders and prints the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import selection_guard_summary  # the sibling script: its comparison.csv reader

from clusterfed.experiments.stats import mean_std

REPO = Path(__file__).resolve().parent.parent
BEFORE = REPO / "benchmarks" / "results" / "scale"
REFERENCES = ("oracle", "fedavg")
# clusters.json keys of the clustering step's evidence (written by clusterfed.strategies.adacfl)
EVIDENCE = ("preclustering", "clusters_within_preclusters", "auto_best_clusters", "auto_best_silhouette",
            "auto_clusters", "auto_silhouette", "auto_reference_silhouette", "auto_required_silhouette",
            "auto_max_clusters", "lambda",
            "clustering_round", "one_cluster_reason")


def rows_by_strategy(folder: Path) -> dict[str, dict[int, dict]]:
    """comparison.csv's rows by strategy and seed; none where the folder has no table."""
    return selection_guard_summary.rows_by_strategy(folder) if (folder / "comparison.csv").exists() else {}


def strategy_summary(by_seed: dict[int, dict], source: str) -> dict:
    seeds = sorted(by_seed)
    out: dict = {"seeds": seeds, "source": source}
    for column in ("final_ari", "num_clusters", "final_accuracy"):
        stats = mean_std(float(by_seed[s][column]) for s in seeds)
        out[f"{column}_mean"], out[f"{column}_std"] = stats.mean, stats.std
    return out


def clustering_evidence(run: Path) -> dict:
    """The clustering step's numbers of one AdaCFL run (its clusters.json)."""
    clusters = json.loads((run / "clusters.json").read_text())
    evidence = {key: clusters.get(key) for key in EVIDENCE}
    evidence["num_preclusters"] = len(clusters.get("precluster_cuts") or []) or 1
    evidence["clusters_at_clustering"] = len(set(clusters.get("labels") or []))
    evidence["clients_clustered"] = len(clusters.get("client_order") or [])
    evidence["final_clusters"] = len(set((clusters.get("assignment") or {}).values()))
    return evidence


def _shown(folder: Path) -> str:
    """The folder as the repository names it (as given when it lies elsewhere)."""
    resolved = folder.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(folder)


def grid_summary(folder: Path) -> dict:
    runs = rows_by_strategy(folder)
    before = rows_by_strategy(BEFORE / folder.name)
    out: dict = {"strategies": {}, "adacfl_before": None, "adacfl_runs": {}}
    for name, by_seed in runs.items():
        out["strategies"][name] = strategy_summary(by_seed, _shown(folder))
    for name in REFERENCES:
        if name not in out["strategies"] and name in before:
            seeds = sorted(s for s in before[name] if s in runs.get("adacfl", {}))
            out["strategies"][name] = strategy_summary({s: before[name][s] for s in seeds},
                                                       f"benchmarks/results/scale/{folder.name}")
    if "adacfl" in before:
        seeds = [s for s in sorted(before["adacfl"]) if s in runs.get("adacfl", {})]
        out["adacfl_before"] = strategy_summary({s: before["adacfl"][s] for s in seeds},
                                                f"benchmarks/results/scale/{folder.name}")
    for run in sorted((folder / "adacfl").glob("seed*")):
        if (run / "clusters.json").exists():
            out["adacfl_runs"][run.name] = clustering_evidence(run)
    return out


def grid_table(name: str, summary: dict) -> list[str]:
    lines = [f"### {summary['folder']}", "", "| strategy | seeds | final ARI | clusters | final accuracy | from |", "|---|---|---|---|---|---|"]
    rows = [(k, v) for k, v in summary["strategies"].items()]
    if summary["adacfl_before"]:
        rows.append(("adacfl, before (paper's union, best silhouette)", summary["adacfl_before"]))
    for label, s in rows:
        lines.append(f"| {label} | {', '.join(map(str, s['seeds']))} | {s['final_ari_mean']:.2f} ± {s['final_ari_std']:.2f} | "
                     f"{s['num_clusters_mean']:.1f} ± {s['num_clusters_std']:.1f} | {s['final_accuracy_mean']:.3f} ± "
                     f"{s['final_accuracy_std']:.3f} | {s['source']} |")
    lines += ["", "| AdaCFL run | clients clustered | pre-clusters | clusters inside them | after the merge | "
                  "best cut (clusters, silhouette) | chosen cut | λ | final clusters |", "|---|---|---|---|---|---|---|---|---|"]
    for seed, e in summary["adacfl_runs"].items():
        best = "–" if e["auto_best_silhouette"] is None else f"{e['auto_best_clusters']}, {e['auto_best_silhouette']:.3f}"
        chosen = "–" if e["auto_silhouette"] is None else f"{e['auto_clusters']}, {e['auto_silhouette']:.3f}"
        if e.get("auto_max_clusters"):
            chosen += f" (at most {e['auto_max_clusters']})"
        lines.append(f"| {seed} | {e['clients_clustered']} | {e['num_preclusters']} | {e['clusters_within_preclusters']} | "
                     f"{e['clusters_at_clustering']} | {best} | {chosen} | {e['lambda']:.3f} | {e['final_clusters']} |")
        if e["one_cluster_reason"]:
            lines.append(f"\n{seed}, one cluster: {e['one_cluster_reason']}\n")
    return lines + [""]


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).parent / "results" / "scale-adacfl"
    # keys without dots ("frac0.1" -> "frac0_1"), so that a dotted path names one value
    summary = {folder.name.replace(".", "_"): {"folder": folder.name, **grid_summary(folder)}
               for folder in sorted(root.iterdir()) if (folder / "comparison.csv").exists()}
    text = "\n".join(sum((grid_table(name, grid) for name, grid in summary.items()), [
        f"# AdaCFL's cluster count: {_shown(root)}", "",
        "Generated by benchmarks/adacfl_scale_summary.py from each folder's comparison.csv and AdaCFL's "
        "clusters.json. 'before': AdaCFL's row in benchmarks/results/scale (the union of the pre-clusters' "
        "cuts, the best-silhouette λ). Oracle and FedAvg come from benchmarks/results/scale where this folder "
        "did not run them (the same settings and seeds).", ""]))
    selection_guard_summary.write_summary(root, text, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
