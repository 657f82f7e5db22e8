"""Second-phase grids whose values come from the first phase's results.

``kind = "dendrogram-cuts"`` (the FedClust paper's Fig. 4, ``benchmarks/experiments/
lambda-sensitivity.toml``): the grid ``of`` runs the strategy with its own threshold choice;
the thresholds tried are then read off the first seed's dendrogram (``linkage`` in that
run's ``clusters.json``): for each target cluster count k in ``counts`` the midpoint between
the two merge heights that give k clusters (a threshold below every merge keeps every client
alone, one above the last gives one cluster). Each threshold runs as ``param`` on every seed
of ``of`` in the folder ``k<k>/``. Written to the experiment's folder: ``<param>.csv`` (one
row per threshold × seed), ``table.md`` (mean ± std over seeds, the strategy's own choice
in bold) and ``<param>.png``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.experiments.comparison import run_row
from clusterfed.experiments.spec import Experiment, Grid, Sweep, Variant
from clusterfed.experiments.stats import mean_std


def cuts_for_counts(linkage: np.ndarray, counts: list[int]) -> dict[int, float]:
    """Threshold giving k clusters on this dendrogram: midway between the merge heights around the cut."""
    heights = np.sort(np.asarray(linkage, dtype=float)[:, 2])
    n = len(heights) + 1
    out = {}
    for k in counts:
        if k >= n:
            out[k] = float(heights[0] / 2)
        elif k <= 1:
            out[k] = float(heights[-1] * 1.05)
        else:
            out[k] = float((heights[n - k - 1] + heights[n - k]) / 2)
    return out


def sweep_grids(sweep: Sweep, experiment: Experiment, grids: list[Grid]) -> tuple[Grid, dict[int, float], list[Grid]]:
    """The grid swept (``sweep.of``), the threshold that cuts its first run's dendrogram into
    each asked cluster count, and one grid per count with that threshold set."""
    of = next(g for g in grids if g.folder == sweep.of)
    first = of.seeds[0]
    chosen = json.loads((experiment.out / of.folder / sweep.strategy / f"seed{first}" / "clusters.json").read_text())
    variant = next(v for v in of.variants if v.label == sweep.strategy)
    targets = cuts_for_counts(np.array(chosen["linkage"]), sweep.counts)
    grids = [Grid(f"k{k}", of.setting, of.values,
                  [Variant(variant.label, variant.strategy, {**variant.params, sweep.param: float(f"{value:.6g}")})],
                  of.seeds, f"{sweep.param} = {value:.4g}") for k, value in targets.items()]
    return of, targets, grids


def write_sweep(sweep: Sweep, out: Path, of: Grid, targets: dict[int, float], rows: dict[str, list[dict[str, Any]]],
                manifest: dict[str, Any]) -> None:
    """The sweep's CSV, table and plot from the first phase's rows and the swept grids' ``rows``."""
    records = planned_rows(out, of, sweep)
    for k, value in targets.items():
        for row in rows[f"k{k}"]:
            records.append({"label": f"{value:.4g}", "value": float(f"{value:.6g}"), "k_target": k, **row})
    fields = (sweep.param, f"{sweep.param}_value", "k_target", "seed", "num_clusters", "final_accuracy", "best_accuracy",
              "final_ari", "accuracy_std", "mb_up", "mb_down")
    with (out / f"{sweep.param}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, sweep.param: r["label"], f"{sweep.param}_value": r["value"]} for r in records)
    write_table(records, out / "table.md", sweep, of, manifest)
    plot(records, out / f"{sweep.param}.png", sweep)


def planned_rows(out: Path, of: Grid, sweep: Sweep) -> list[dict[str, Any]]:
    """The first phase's rows of the swept strategy, with the threshold each run chose itself."""
    records = []
    for seed in of.seeds:
        run_dir = out / of.folder / sweep.strategy / f"seed{seed}"
        clusters = json.loads((run_dir / "clusters.json").read_text())
        records.append({"label": "auto", "value": clusters[sweep.param], "k_target": "",
                        **run_row(run_dir, sweep.strategy)})
    return records


def _summary(records: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record["label"], []).append(record)
    out = []
    for label, group in groups.items():
        def stat(key):
            return mean_std(g[key] for g in group)
        out.append({"label": label, "value": stat("value"), "clusters": stat("num_clusters"),
                    "accuracy": stat("final_accuracy"), "ari": stat("final_ari"), "acc_std": stat("accuracy_std")})
    return sorted(out, key=lambda s: s["value"].mean)


def write_table(records: list[dict], path: Path, sweep: Sweep, of: Grid, manifest: dict[str, Any]) -> None:
    command = " ".join(manifest.get("command", [])) or "clusterfed experiment"
    param = sweep.param if sweep.param != "lambda" else "λ"
    rounds = of.values.get("rounds")
    lines = [f"# {sweep.title or sweep.strategy}: accuracy and clusters vs {param} ({of.setting}, "
             f"{rounds} rounds, seeds {', '.join(map(str, of.seeds))})", "",
             f"`{command}`. {param} values are cuts of seed {of.seeds[0]}'s dendrogram (`k` = the cluster count "
             f"they give there); `auto` (bold) is {sweep.title or sweep.strategy}'s own choice per seed.", "",
             f"| {param} | k on seed {of.seeds[0]} | clusters | final accuracy | ARI | accuracy std over clients |",
             "|---|---|---|---|---|---|"]
    targets = {r["label"]: r["k_target"] for r in records}
    for s in _summary(records):
        name = f"**auto ({s['value'].mean:.4g})**" if s["label"] == "auto" else s["label"]
        lines.append(f"| {name} | {targets[s['label']]} | {s['clusters'].format(1)} | {s['accuracy'].format(3)} | "
                     f"{s['ari'].mean:.2f} | {s['acc_std'].mean:.3f} |")
    path.write_text("\n".join(lines) + "\n")


def plot(records: list[dict], path: Path, sweep: Sweep) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    param = sweep.param if sweep.param != "lambda" else "λ"
    summary = _summary(records)
    fixed = [s for s in summary if s["label"] != "auto"]
    auto = next(s for s in summary if s["label"] == "auto")
    x = np.array([s["value"].mean for s in fixed])
    fig, ax = plt.subplots(figsize=(7, 4))
    acc = np.array([s["accuracy"].mean for s in fixed])
    err = np.array([s["accuracy"].std for s in fixed])
    ax.errorbar(x, acc, yerr=err, color="C0", marker="o", label="final accuracy")
    ax.set(xlabel=f"{param} (distance threshold)", ylabel="mean local test accuracy", ylim=(0, 1.02))
    ax.plot([auto["value"].mean], [auto["accuracy"].mean], marker="*", ms=14, color="C3", ls="",
            label=f"auto ({param} ≈ {auto['value'].mean:.3g})")
    right = ax.twinx()
    right.plot(x, [s["clusters"].mean for s in fixed], color="C1", marker="s", ls="--", label="clusters")
    right.set_ylabel("clusters")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    ax.set_title(f"{sweep.title or sweep.strategy}: local models (small {param}) ↔ one global model (large {param})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
