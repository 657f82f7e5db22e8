"""FedClust's λ trade-off (FedClust paper, Fig. 4): accuracy and number of clusters vs λ.

    python benchmarks/lambda_sensitivity.py full  [--workers 2]   # part of make bench
    python benchmarks/lambda_sensitivity.py quick [--workers 2]   # part of make bench-quick

Digits, 20 clients, digit pairs (5 true groups). First FedClust runs with ``lambda = auto``
(every seed); the λ values tried are then read off seed 0's dendrogram (``linkage`` in its
``clusters.json``): for each target cluster count k in ``COUNTS`` the midpoint between the
two merge heights that give k clusters — a small λ keeps every client alone (≈ local
models), a λ above the last merge gives one cluster (≈ FedAvg). Every λ runs on every seed.
Writes ``benchmarks/results/lambda_sensitivity[-quick]/``: ``lambda.csv`` (one row per λ ×
seed), ``table.md`` (mean ± std over seeds, ``auto`` marked) and ``lambda.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from clusterfed.compare import Progress, build_grid, run_grid  # noqa: E402
from suite import COMMON, DIGITS  # noqa: E402

COUNTS = (20, 12, 8, 6, 5, 4, 3, 2, 1)
PROFILES = {
    "full": {"folder": "lambda_sensitivity", "rounds": 20, "seeds": (0, 1), "counts": COUNTS},
    "quick": {"folder": "lambda_sensitivity-quick", "rounds": 5, "seeds": (0,), "counts": (20, 5, 1)},
}


def lambdas_for_counts(linkage: np.ndarray, counts: tuple[int, ...]) -> dict[int, float]:
    """λ giving k clusters on this dendrogram: midway between the merge heights around the cut."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", choices=tuple(PROFILES))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    out = ROOT / "results" / profile["folder"]
    base = {**COMMON, **DIGITS["pairs"], "rounds": profile["rounds"]}
    seeds = list(profile["seeds"])
    started = time.perf_counter()

    auto_configs = build_grid(base, ["fedclust"], seeds, out / "auto")
    auto_rows = run_grid(auto_configs, workers=args.workers, progress=Progress(len(auto_configs)))
    seed0 = json.loads((out / "auto" / "fedclust" / f"seed{seeds[0]}" / "clusters.json").read_text())
    targets = lambdas_for_counts(np.array(seed0["linkage"]), profile["counts"])
    configs, labels = [], []
    for k, value in targets.items():
        grid = build_grid({**base, "lambda": f"{value:.6g}"}, ["fedclust"], seeds, out / f"k{k}")
        configs += grid
        labels += [(f"{value:.4g}", k)] * len(grid)
    rows = run_grid(configs, workers=args.workers, progress=Progress(len(configs)))

    records = []
    for row, config in zip(auto_rows, auto_configs):
        clusters = json.loads((Path(config.out_dir) / "clusters.json").read_text())
        records.append({"lambda": "auto", "lambda_value": clusters["lambda"], "k_target": "", **row})
    for row, (value, k) in zip(rows, labels):
        records.append({"lambda": value, "lambda_value": float(value), "k_target": k, **row})
    fields = ("lambda", "lambda_value", "k_target", "seed", "num_clusters", "final_accuracy", "best_accuracy",
              "final_ari", "accuracy_std", "mb_up", "mb_down")
    with (out / "lambda.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    write_table(records, out, profile, time.perf_counter() - started)
    plot(records, out / "lambda.png")
    print((out / "table.md").read_text())
    return 0


def _summary(records: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record["lambda"], []).append(record)
    out = []
    for label, group in groups.items():
        def ms(key):
            values = np.array([g[key] for g in group if g[key] is not None], dtype=float)
            return (float(values.mean()), float(values.std())) if len(values) else (float("nan"), 0.0)
        out.append({"lambda": label, "lambda_value": ms("lambda_value"), "clusters": ms("num_clusters"),
                    "accuracy": ms("final_accuracy"), "ari": ms("final_ari"), "acc_std": ms("accuracy_std")})
    return sorted(out, key=lambda s: s["lambda_value"][0])


def write_table(records: list[dict], out: Path, profile: dict, seconds: float) -> None:
    lines = [f"# FedClust: accuracy and clusters vs λ (digits, digit pairs, 20 clients, {profile['rounds']} rounds, "
             f"seeds {', '.join(map(str, profile['seeds']))})", "",
             f"`python benchmarks/lambda_sensitivity.py {'full' if profile['folder'] == 'lambda_sensitivity' else 'quick'}`"
             f" ({seconds / 60:.1f} min). 5 true groups. λ values are cuts of seed 0's dendrogram "
             "(`k` = the cluster count they give there); `auto` (bold) is FedClust's own choice per seed "
             "(best silhouette).", "",
             "| λ | k on seed 0 | clusters | final accuracy | ARI | accuracy std over clients |",
             "|---|---|---|---|---|---|"]
    targets = {r["lambda"]: r["k_target"] for r in records}
    for s in _summary(records):
        auto = s["lambda"] == "auto"
        name = f"**auto ({s['lambda_value'][0]:.4g})**" if auto else s["lambda"]
        lines.append(f"| {name} | {targets[s['lambda']]} | {s['clusters'][0]:.1f} ± {s['clusters'][1]:.1f} | "
                     f"{s['accuracy'][0]:.3f} ± {s['accuracy'][1]:.3f} | {s['ari'][0]:.2f} | {s['acc_std'][0]:.3f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = _summary(records)
    fixed = [s for s in summary if s["lambda"] != "auto"]
    auto = next(s for s in summary if s["lambda"] == "auto")
    x = np.array([s["lambda_value"][0] for s in fixed])
    fig, ax = plt.subplots(figsize=(7, 4))
    acc = np.array([s["accuracy"][0] for s in fixed])
    err = np.array([s["accuracy"][1] for s in fixed])
    ax.errorbar(x, acc, yerr=err, color="C0", marker="o", label="final accuracy")
    ax.set(xlabel="λ (distance threshold)", ylabel="mean local test accuracy", ylim=(0, 1.02))
    ax.plot([auto["lambda_value"][0]], [auto["accuracy"][0]], marker="*", ms=14, color="C3", ls="",
            label=f"auto (λ ≈ {auto['lambda_value'][0]:.3g})")
    right = ax.twinx()
    right.plot(x, [s["clusters"][0] for s in fixed], color="C1", marker="s", ls="--", label="clusters")
    right.set_ylabel("clusters")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    ax.set_title("FedClust: local models (small λ) ↔ one global model (large λ)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
