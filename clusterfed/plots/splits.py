"""Figures of the bi-partitioning strategies (CFL, LayerCFL, HiCFL), drawn from a results
folder's clusters.json and rounds.jsonl so they can be redrawn:

- ``split_timeline.png``: mean ± std client accuracy, a vertical line at every split
  (dotted grey: refused splits — silhouette test or LayerCFL check), number of clusters;
- ``update_norms.png``: per cluster the mean-update norm and the largest client norm
  against ``eps1``/``eps2`` (absolute criteria), or the two ratios the relative criteria
  compare with ``rel-eps1``/``rel-eps2``;
- ``stability.png`` (HiCFL): windowed model stability per client and layer against ε;
- ``similarity_splits.png``: the cosine similarity matrix of each split, rows and columns
  ordered side a | side b and labelled ``key:true group``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from clusterfed.results import load_run  # noqa: E402

MAX_SIMILARITY_PANELS = 12


def plot_split_figures(out_dir: str | Path) -> list[Path]:
    """Draw the figures that apply to this run; returns the files written (none for a
    strategy that does not split)."""
    out = Path(out_dir)
    if not (out / "clusters.json").exists() or not (out / "rounds.jsonl").exists():
        return []
    clusters = json.loads((out / "clusters.json").read_text())
    if "splits" not in clusters:
        return []
    rounds, summary = load_run(out)
    if not rounds:
        return []
    config = summary.get("config", {})
    title = f"{clusters.get('strategy', '?')} · {config.get('dataset', '?')} / {config.get('partitioner', '?')}"
    splits = clusters["splits"]
    written = []
    path = out / "split_timeline.png"
    plot_split_timeline(rounds, splits, clusters.get("refused_splits", []), path, title)
    written.append(path)
    if any(r.get("split_criteria") for r in rounds):
        path = out / "update_norms.png"
        plot_update_norms(rounds, splits, clusters.get("criteria", {}), path, title)
        written.append(path)
    if any(r.get("stability") for r in rounds):
        path = out / "stability.png"
        plot_stability(rounds, splits, path, title)
        written.append(path)
    if any("similarity" in s for s in splits):
        path = out / "similarity_splits.png"
        plot_similarity(splits, clusters.get("true_groups", {}), path, title)
        written.append(path)
    return written


def _split_lines(ax, splits: list[dict], label: bool = True) -> None:
    for i, split in enumerate(splits):
        ax.axvline(split["round"], color="C3", lw=1, alpha=0.7, label="split" if label and i == 0 else None)


def _nan(value) -> float:
    return np.nan if value is None else float(value)


def plot_split_timeline(rounds: list[dict], splits: list[dict], refused: list[dict], path: Path, title: str) -> None:
    x = np.array([r["round"] for r in rounds])
    mean = np.array([_nan(r["accuracy"]) for r in rounds])
    std = np.array([_nan(r["accuracy_std"]) for r in rounds])
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(x, mean, color="C0", lw=2, label="mean client accuracy")
    ax.fill_between(x, mean - std, mean + std, color="C0", alpha=0.2, label="± std over clients")
    _split_lines(ax, splits)
    for i, round_ in enumerate(sorted({r["round"] for r in refused})):
        ax.axvline(round_, color="grey", ls=":", lw=0.8, label="split refused (silhouette or check)" if i == 0 else None)
    for split in splits:
        ax.annotate(f"{split['parent']}→{split['children'][0]}|{split['children'][1]}", (split["round"], 0.02),
                    rotation=90, fontsize=7, color="C3", ha="right", va="bottom")
    ax.set(xlabel="round", ylabel="local test accuracy", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.step(x, [r["num_clusters"] for r in rounds], where="post", color="C2", lw=1, label="clusters")
    twin.set_ylabel("number of clusters", color="C2")
    twin.set_ylim(0, max(r["num_clusters"] for r in rounds) + 1)
    lines, labels = ax.get_legend_handles_labels()
    lines2, labels2 = twin.get_legend_handles_labels()
    ax.legend(lines + lines2, labels + labels2, fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cluster_series(rounds: list[dict], field: str) -> dict[str, tuple[list[int], list[float]]]:
    series: dict[str, tuple[list[int], list[float]]] = {}
    for r in rounds:
        for cluster, values in (r.get("split_criteria") or {}).items():
            xs, ys = series.setdefault(cluster, ([], []))
            xs.append(r["round"])
            ys.append(values[field])
    return series


def plot_update_norms(rounds: list[dict], splits: list[dict], criteria: dict, path: Path, title: str) -> None:
    mode = criteria.get("mode", "relative")
    mean, largest = _cluster_series(rounds, "mean_norm"), _cluster_series(rounds, "max_norm")
    reference = _cluster_series(rounds, "reference_mean_norm")
    panels = 3 if mode == "relative" else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4), squeeze=False)
    axes = axes[0]
    ax = axes[0]
    for i, cluster in enumerate(sorted(mean, key=int)):
        color = f"C{i % 10}"
        ax.plot(*mean[cluster], color=color, lw=1.5, label=f"cluster {cluster}")
        ax.plot(*largest[cluster], color=color, lw=1, ls="--")
    ax.plot([], [], color="grey", lw=1.5, label="‖mean Δ‖ (solid)")
    ax.plot([], [], color="grey", lw=1, ls="--", label="max ‖Δ_c‖ (dashed)")
    if mode == "absolute":
        ax.axhline(criteria.get("eps1", np.nan), color="k", ls=":", lw=1, label="eps1 (mean below)")
        ax.axhline(criteria.get("eps2", np.nan), color="k", ls="-.", lw=1, label="eps2 (max above)")
    ax.set(xlabel="round", ylabel="update norm", title=f"{title}\n{mode} criteria")
    if mode == "relative":
        ax1, ax2 = axes[1], axes[2]
        for i, cluster in enumerate(sorted(mean, key=int)):
            color = f"C{i % 10}"
            xs, m = mean[cluster]
            _, r = reference[cluster]
            _, mx = largest[cluster]
            ax1.plot(xs, np.array(m) / np.maximum(np.array(r), 1e-12), color=color, lw=1.2, label=f"cluster {cluster}")
            ax2.plot(xs, np.array(mx) / np.maximum(np.array(m), 1e-12), color=color, lw=1.2, label=f"cluster {cluster}")
        ax1.axhline(criteria.get("rel_eps1", np.nan), color="k", ls=":", lw=1, label="rel-eps1 (stationary below)")
        ax2.axhline(criteria.get("rel_eps2", np.nan), color="k", ls="-.", lw=1, label="rel-eps2 (heterogeneous above)")
        ax1.set(xlabel="round", ylabel="‖mean Δ‖ / largest ‖mean Δ‖ so far", ylim=(0, 1.05))
        ax2.set(xlabel="round", ylabel="max ‖Δ_c‖ / ‖mean Δ‖")
    for a in axes:
        _split_lines(a, splits)
        a.grid(alpha=0.3)
        handles, labels = a.get_legend_handles_labels()
        if len(labels) > 12:  # many clusters: keep the styles and thresholds, drop the cluster names
            keep = [i for i, label in enumerate(labels) if not label.startswith("cluster ")]
            handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
        a.legend(handles, labels, fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_stability(rounds: list[dict], splits: list[dict], path: Path, title: str) -> None:
    layers = list(dict.fromkeys(layer for r in rounds for values in (r.get("stability") or {}).values()
                                for layer in values))
    keys = sorted({k for r in rounds for k in (r.get("stability") or {})}, key=lambda k: (len(k), k))
    epsilon = next((r["stability_eps"] for r in rounds if "stability_eps" in r), None)
    cols = min(len(layers), 2)
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    x = [r["round"] for r in rounds]
    floor = 1e-4  # log scale: a window of perfectly stable updates has S = 0
    for ax, layer in zip(axes.ravel(), layers):
        lines = [[_nan((r.get("stability") or {}).get(key, {}).get(layer)) for r in rounds] for key in keys]
        # a log axis needs a positive value: with none (no window ever full, as when splits on
        # evidence come before the windows fill) the panel stays linear and says so
        full = any(np.isfinite(y) for ys in lines for y in ys)
        for i, ys in enumerate(lines):
            # markers: a window that is full only in the round its cluster splits is one point
            ax.plot(x, np.maximum(ys, floor), lw=0.8, marker=".", ms=3, color=f"C{i % 10}", alpha=0.8)
        if epsilon is not None and np.isfinite(epsilon) and (epsilon > 0 or not full):
            ax.axhline(epsilon, color="k", ls="--", lw=1.2, label=f"ε = {epsilon:g}")
        _split_lines(ax, splits)
        ax.set(xlabel="round", ylabel="windowed stability S", title=f"layer {layer}")
        if full:
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no stability window full", transform=ax.transAxes, ha="center", va="center",
                    fontsize=8, color="grey")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # neither ε nor a split: nothing to name
            ax.legend(fontsize=7, loc="upper left")
    for ax in axes.ravel()[len(layers):]:
        ax.axis("off")
    fig.suptitle(f"{title}: stability per client (one line each)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_similarity(splits: list[dict], true_groups: dict, path: Path, title: str) -> None:
    shown = [s for s in splits if "similarity" in s][:MAX_SIMILARITY_PANELS]
    cols = min(len(shown), 3)
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.4 * rows), squeeze=False)
    image = None
    for ax, split in zip(axes.ravel(), shown):
        keys = split["similarity"]["keys"]
        S = np.array(split["similarity"]["matrix"])
        # within a side, clients of one true group next to each other (display only)
        def by_group(side):
            return sorted((k for k in side if k in keys), key=lambda k: (str(true_groups.get(k, "")), keys.index(k)))

        side_a, side_b = by_group(split["members"][0]), by_group(split["members"][1])
        order = [keys.index(k) for k in side_a + side_b]
        image = ax.imshow(S[np.ix_(order, order)], vmin=-1, vmax=1, cmap="RdBu_r")
        labels = [f"{keys[i]}:{true_groups.get(keys[i], '?')}" for i in order]
        ax.set_xticks(range(len(order)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(order)), labels, fontsize=6)
        edge = len(side_a) - 0.5
        ax.axhline(edge, color="k", lw=1)
        ax.axvline(edge, color="k", lw=1)
        gap, true_gap = split.get("gap"), split.get("true_group_gap")
        layer = f" · {split['layer']}" if "layer" in split else ""
        children = f"{split['children'][0]}|{split['children'][1]}"
        ax.set_title(f"round {split['round']}: {split['parent']}→{children}{layer}\n"
                     f"Gap {gap:+.2f}" + (f" · true-group Gap {true_gap:+.2f}" if true_gap is not None else ""),
                     fontsize=8)
    for ax in axes.ravel()[len(shown):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="cosine similarity")
    fig.suptitle(f"{title}: similarity at each split (key:true group)", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
