"""Does the automatic cut find clear groups among 6-16 clients (and 40, 100), and how often
does it split clients that hold none? A clustering-level experiment on generated update
vectors.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_small_federations.py

Each data set: m client rows of d = 850 coordinates (the size of the final layer of Flower's
quickstart-pytorch CNN, 84 × 10 + 10): a common direction shared by every client (norm 1,
what every client's training has in common) plus Gaussian noise of total variance 1 whose
spectrum is flat (``isotropic``) or falls as a power law (``1/sqrt(i)``, ``1/i``: a few
directions carry much of it, as in real updates). Structured sets add three equal groups
whose centres are ``separation`` × a random unit vector. ``cluster_auto`` (cosine distance,
average linkage: FedClust's and AdaCFL's defaults; ``--metrics cosine,l2`` adds L2) is run
under three rules:

- ``fixed``: the best cut counts when its silhouette reaches 0.25;
- ``gaussian``: ... or beats the best of 19 Gaussian reference sets with the rows' mean and
  covariance (the one-shot cut's reference before the rotation; CFL's split test still uses it);
- ``rotation``: ... or beats the best of 19 rotations of the rows about their mean (the
  default now; ``clusterfed/clustering/null_reference.py``).

Reported per cell: ``split`` = how often the rule kept more than one cluster (on group-free
data: the false-split rate) and ``recovered`` = how often it kept a cut with ARI >= 0.9
against the true groups (structured data); ``best_cut_right`` = how often the best cut had
ARI >= 0.9 at all (what any rule could reach). Writes
``benchmarks/results/small_federations/{results.json,README.md,manifest.json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from clusterfed.clustering.agglomerative import cluster_auto  # noqa: E402
from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402

RULES = ("fixed", "gaussian", "rotation")
SPECTRA = {"isotropic": lambda d: np.ones(d), "1/sqrt(i)": lambda d: 1 / np.sqrt(np.arange(1, d + 1)),
           "1/i": lambda d: 1 / np.arange(1, d + 1)}


def data_set(rng: np.random.Generator, m: int, d: int, spectrum: np.ndarray, separation: float,
             groups: int = 3) -> tuple[np.ndarray, np.ndarray]:
    scale = np.sqrt(spectrum / spectrum.sum())  # total noise variance 1
    labels = np.arange(m) % groups
    X = rng.standard_normal((m, d)) * scale + 1.0 / np.sqrt(d)  # the common direction, norm 1
    if separation > 0:
        centres = rng.standard_normal((groups, d))
        X += separation * (centres / np.linalg.norm(centres, axis=1, keepdims=True))[labels]
    return X, labels


def run_cell(m: int, d: int, spectrum: str, separation: float, metric: str, draws: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    split = dict.fromkeys(RULES, 0)
    recovered = dict.fromkeys(RULES, 0)
    best_right = 0
    for draw in range(draws):
        X, labels = data_set(rng, m, d, SPECTRA[spectrum](d), separation)
        cuts = {"fixed": cluster_auto(X, metric=metric),
                "gaussian": cluster_auto(X, metric=metric, reference_draws=19, seed=draw, reference_method="gaussian"),
                "rotation": cluster_auto(X, metric=metric, reference_draws=19, seed=draw, reference_method="rotation")}
        best = cluster_auto(X, metric=metric, min_silhouette=-1.0)
        best_right += adjusted_rand_score(labels, best.labels) >= 0.9
        for rule, cut in cuts.items():
            split[rule] += cut.num_clusters > 1
            recovered[rule] += cut.num_clusters > 1 and adjusted_rand_score(labels, cut.labels) >= 0.9
    cell = {"clients": m, "dimensions": d, "spectrum": spectrum, "separation": separation, "metric": metric,
            "draws": draws, "split": {r: split[r] / draws for r in RULES}}
    if separation > 0:
        cell["recovered"] = {r: recovered[r] / draws for r in RULES}
        cell["best_cut_right"] = best_right / draws
    return cell


def table(cells: list[dict], separation: float, field: str) -> list[str]:
    rows = [c for c in cells if c["separation"] == separation]
    sizes = sorted({c["clients"] for c in rows})
    lines = ["| metric | spectrum | rule | " + " | ".join(f"m={m}" for m in sizes) + " |",
             "|---|---|---|" + "---:|" * len(sizes)]
    for metric in sorted({c["metric"] for c in rows}):
        for spectrum in SPECTRA:
            for rule in RULES:
                values = [next(c for c in rows if c["clients"] == m and c["spectrum"] == spectrum
                               and c["metric"] == metric)[field][rule] for m in sizes]
                lines.append(f"| {metric} | {spectrum} | {rule} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="6,9,12,16,40,100")
    parser.add_argument("--separations", default="0,0.5,0.8")
    parser.add_argument("--metrics", default="cosine")
    parser.add_argument("--null-draws", type=int, default=200, help="group-free data sets per cell")
    parser.add_argument("--draws", type=int, default=40, help="structured data sets per cell")
    parser.add_argument("--dimensions", type=int, default=850)
    parser.add_argument("--out", default=str(ROOT / "results" / "small_federations"))
    args = parser.parse_args()
    config = vars(args)
    manifest = start_manifest(config)
    cells = []
    for separation in [float(s) for s in args.separations.split(",")]:
        for metric in args.metrics.split(","):
            for spectrum in SPECTRA:
                for m in [int(c) for c in args.clients.split(",")]:
                    draws = args.null_draws if separation == 0 else args.draws
                    seed = (
                        int(1000 * separation) * 100000 + m * 100 + list(SPECTRA).index(spectrum) * 10 + (metric == "l2"))
                    cell = run_cell(m, args.dimensions, spectrum, separation, metric, draws, seed)
                    cells.append(cell)
                    print(json.dumps(cell), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"config": config, "cells": cells}, indent=1) + "\n")
    lines = ["# The automatic cut at 6-16 clients", "",
             "Written by `benchmarks/bench_small_federations.py` (its docstring says what the data and rules are).", ""]
    for separation in sorted({c["separation"] for c in cells}):
        if separation == 0:
            lines += ["## Group-free data: how often each rule splits (false-split rate)", ""]
            lines += table(cells, separation, "split")
        else:
            lines += ["", f"## Three groups, separation {separation}: how often each rule keeps the true groups "
                      "(ARI >= 0.9)", ""]
            lines += table(cells, separation, "recovered")
            right = [c for c in cells if c["separation"] == separation]
            lines += ["", "Best cut right (any rule's ceiling): " + ", ".join(
                f"{c['metric']} {c['spectrum']} m={c['clients']}: {c['best_cut_right']:.2f}" for c in right)]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    write_manifest(out, manifest)


if __name__ == "__main__":
    main()
