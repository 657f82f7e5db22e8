"""Privacy–utility table: noise multiplier × strategy → final accuracy, ARI, ε at δ.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_privacy.py            # run, then summarise
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_privacy.py --no-run   # summarise the runs on disk

Runs ``benchmarks/experiments/privacy.toml`` (FedAvg, FedClust and CFL on digit pairs, 20
clients, 20 rounds, seed 0; without DP, and at clipping norm 0.1 with noise multipliers 0, 0.3,
0.7 and 1.0 and at clipping norm 1.0 with 0 and 1.0; needs ``clusterfed[privacy]``) with ``clusterfed experiment``, which writes each
run and the folder's ``manifest.json`` under ``benchmarks/results/privacy/``; then reads every
run's last round and writes ``summary.json`` (rows, and ``by.<strategy>.<grid>`` for quoting),
``table.md`` and ``privacy.png`` there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
EXPERIMENT = ROOT / "experiments" / "privacy.toml"
OUT = ROOT / "results" / "privacy"


def key_of(folder: str) -> str:
    """A grid folder as a key without dots (``noise-0.3`` → ``noise_0_3``), for dotted bind keys."""
    return folder.replace("-", "_").replace(".", "_")


def last_round(run: Path) -> dict:
    return json.loads((run / "rounds.jsonl").read_text().strip().splitlines()[-1])


def summarise(out: Path, spec: dict) -> dict:
    rows, by = [], {}
    for grid in spec["grid"]:
        config = {**spec.get("config", {}), **grid.get("config", {})}
        for strategy in spec["strategies"]:
            runs = sorted((out / grid["folder"] / strategy).glob("seed*"))
            last = [last_round(run) for run in runs]
            if not last:
                continue
            privacy = [row.get("privacy") for row in last]
            noise = [np.mean([c["noise_std"] for c in p["clusters"].values() if "noise_std" in c]) for p in privacy if p]
            row = {
                "grid": grid["folder"], "title": grid["title"], "strategy": strategy, "seeds": len(last),
                "noise_multiplier": config.get("dp-noise-multiplier", 0.0) if "dp-clipping-norm" in config else None,
                "clipping_norm": config.get("dp-clipping-norm"),
                "accuracy": float(np.mean([r["accuracy"] for r in last])),
                "accuracy_std": float(np.std([r["accuracy"] for r in last])),
                "ari": float(np.mean([r["ari"] for r in last])),
                "clusters": float(np.mean([r["num_clusters"] for r in last])),
                "epsilon": float(np.max([p["epsilon"] for p in privacy])) if all(privacy) else None,
                "delta": privacy[0]["delta"] if all(privacy) else None,
                "noise_std": float(np.mean(noise)) if noise else None,
            }
            rows.append(row)
            by.setdefault(strategy, {})[key_of(grid["folder"])] = row
    return {"experiment": str(EXPERIMENT.relative_to(ROOT.parent)), "rounds": spec["rounds"],
            "setting": spec["grid"][0]["setting"], "rows": rows, "by": by}


def table(summary: dict) -> str:
    lines = ["| DP | strategy | accuracy | ARI | clusters | noise std per cluster (last round) | ε at δ |",
             "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        eps = f"{r['epsilon']:.1f} at {r['delta']:g}" if r["epsilon"] is not None else "∞ (no noise)"
        noise = f"{r['noise_std']:.4f}" if r["noise_std"] is not None else "–"
        lines.append(f"| {r['title']} | {r['strategy']} | {r['accuracy']:.3f} ± {r['accuracy_std']:.3f} | "
                     f"{r['ari']:.2f} | {r['clusters']:.1f} | {noise} | {eps} |")
    return "\n".join(lines) + "\n"


def figure(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    noised = [r for r in summary["rows"] if r["noise_multiplier"] is not None]
    norms = sorted({r["clipping_norm"] for r in noised})
    for strategy in dict.fromkeys(r["strategy"] for r in summary["rows"]):
        colour = None
        for norm, style in zip(norms, ("-o", "--s", ":^")):
            rows = [r for r in noised if r["strategy"] == strategy and r["clipping_norm"] == norm]
            line = ax.errorbar([r["noise_multiplier"] for r in rows], [r["accuracy"] for r in rows],
                               yerr=[r["accuracy_std"] for r in rows], fmt=style, capsize=3, color=colour,
                               label=f"{strategy}, clipping norm {norm:g}")
            colour = line.lines[0].get_color()
        plain = next((r for r in summary["rows"] if r["strategy"] == strategy and r["noise_multiplier"] is None), None)
        if plain:
            ax.axhline(plain["accuracy"], ls=":", lw=1, color=colour)
    first = summary["rows"][0]["strategy"]
    for r in noised:
        if r["epsilon"] is not None and r["strategy"] == first and r["clipping_norm"] == norms[0]:
            ax.annotate(f"ε={r['epsilon']:.0f}", (r["noise_multiplier"], 0.02), ha="center", fontsize=8)
    ax.set_xlabel(f"noise multiplier (ε at δ = {next(r['delta'] for r in noised if r['delta'])} after "
                  f"{summary['rounds']} rounds)")
    ax.set_ylabel("final mean local test accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{summary['setting']}, {summary['rounds']} rounds (dotted: without DP)")
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-run", action="store_true", help="summarise the runs already under the results folder")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    spec = tomllib.loads(EXPERIMENT.read_text())
    if not args.no_run:
        subprocess.run([sys.executable, "-m", "clusterfed.cli", "experiment", str(EXPERIMENT), "--out", str(OUT),
                        "--workers", str(args.workers)], check=True)
    summary = summarise(OUT, spec)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (OUT / "table.md").write_text(table(summary))
    figure(summary, OUT / "privacy.png")
    print(table(summary))


if __name__ == "__main__":
    main()
