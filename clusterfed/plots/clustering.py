"""Figures of a one-shot clustering (FedClust, AdaCFL), drawn from <out>/clusters.json and
rounds.jsonl so they can be redrawn: the distance matrix ordered by cluster with the true
groups on the axes, the dendrogram with the λ cut, and accuracy per cluster per round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from scipy.cluster import hierarchy  # noqa: E402

from clusterfed.results import load_run  # noqa: E402

MAX_TICK_LABELS = 60  # beyond this many clients, per-client tick labels are unreadable


def _group_color(group: int, num_groups: int = 10) -> Any:
    # tab10's strong colours while they suffice; tab20 (with its pale half) beyond ten groups
    if num_groups <= 10:
        return plt.get_cmap("tab10")(int(group) % 10)
    return plt.get_cmap("tab20")(int(group) % 20)


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 62, key)


def _title(state: dict[str, Any]) -> str:
    lam = state.get("lambda")
    lam_text = f"{lam:.3g}" if isinstance(lam, (int, float)) else "per pre-cluster"
    sil = state.get("silhouette")
    sil_text = "n/a" if sil is None else f"{sil:.2f}"
    return (f"{state.get('strategy', '?')}: {state.get('distance', '?')} distance on "
            f"{','.join(state.get('layers', []))}\nλ = {lam_text} · silhouette {sil_text}")


def plot_distance_matrix(clusters_json: dict[str, Any], path: str | Path) -> None:
    """Heat-map of the clustering-round distance matrix, rows and columns ordered by the
    cluster found (white lines between clusters); tick labels and the side strips show
    each client's true group in its colour, so a mixed cluster stands out."""
    D = np.asarray(clusters_json["distance_matrix"], dtype=float)
    keys = list(clusters_json["client_order"])
    labels = list(clusters_json["labels"])
    truth = clusters_json.get("true_groups", {})
    groups = [int(truth.get(k, -1)) for k in keys]
    order = sorted(range(len(keys)), key=lambda i: (labels[i], groups[i], _natural(keys[i])))
    D = D[np.ix_(order, order)]
    m = len(order)

    size = min(12.0, 4.5 + 0.09 * m)
    fig = plt.figure(figsize=(size + 1.2, size))
    grid = fig.add_gridspec(2, 3, width_ratios=[0.03 * size, size, 0.04 * size],
                            height_ratios=[0.03 * size, size], wspace=0.02, hspace=0.02)
    ax = fig.add_subplot(grid[1, 1])
    # aspect auto: the square figure keeps cells square and the strips stay aligned
    image = ax.imshow(D, cmap="viridis_r", interpolation="nearest", aspect="auto")
    boundaries = [i for i in range(1, m) if labels[order[i]] != labels[order[i - 1]]]
    for b in boundaries:
        ax.axhline(b - 0.5, color="white", lw=1.5)
        ax.axvline(b - 0.5, color="white", lw=1.5)
    # true-group strips along the left and the top edges
    num_groups = max(groups) + 1 if groups else 1
    strip_colors = ListedColormap([_group_color(g, num_groups) for g in sorted(set(groups))])
    index_of = {g: i for i, g in enumerate(sorted(set(groups)))}
    strip = np.array([[index_of[groups[i]] for i in order]])
    left = fig.add_subplot(grid[1, 0], sharey=ax)
    left.imshow(strip.T, aspect="auto", cmap=strip_colors, vmin=0, vmax=max(len(index_of) - 1, 1),
                interpolation="nearest")
    left.set_xticks([])
    top = fig.add_subplot(grid[0, 1], sharex=ax)
    top.imshow(strip, aspect="auto", cmap=strip_colors, vmin=0, vmax=max(len(index_of) - 1, 1),
               interpolation="nearest")
    top.tick_params(axis="x", bottom=False, labelbottom=False)
    top.set_yticks([])
    top.set_title(_title(clusters_json), fontsize=9)
    if m <= MAX_TICK_LABELS:
        ticks = [f"{keys[i]}·g{groups[i]}" for i in order]
        ax.set_xticks(range(m), ticks, rotation=90, fontsize=7)
        left.set_yticks(range(m), ticks, fontsize=7)
        for tick_labels in (ax.get_xticklabels(), left.get_yticklabels()):
            for label, i in zip(tick_labels, order):
                label.set_color(_group_color(groups[i], num_groups))
        ax.tick_params(axis="y", left=False, labelleft=False)
    else:
        ax.tick_params(axis="both", bottom=False, labelbottom=False, left=False, labelleft=False)
        left.set_yticks([])
    ax.set_xlabel("client · true group (ordered by cluster found; white lines separate clusters)", fontsize=8)
    left.set_ylabel("client · true group", fontsize=8)
    cax = fig.add_subplot(grid[1, 2])
    fig.colorbar(image, cax=cax, label=f"{clusters_json.get('distance', '')} distance")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _dendrogram_panel(ax, Z: np.ndarray, keys: list[str], truth: dict[str, int], lam: float | None, title: str) -> None:
    leaf_labels = [f"{k}·g{truth.get(k, '?')}" for k in keys]
    many = len(keys) > MAX_TICK_LABELS
    hierarchy.dendrogram(Z, ax=ax, labels=None if many else leaf_labels, no_labels=many,
                         color_threshold=lam if lam is not None else 0, above_threshold_color="grey",
                         leaf_font_size=7, leaf_rotation=90)
    if not many:
        for label in ax.get_xticklabels():
            key = label.get_text().split("·")[0]
            if key in truth:
                label.set_color(_group_color(truth[key], max(truth.values()) + 1))
    if lam is not None:
        ax.axhline(lam, color="red", ls="--", lw=1.2, label=f"λ = {lam:.3g}")
        top = float(Z[:, 2].max()) if len(Z) else lam
        if lam > top:  # the one-cluster fallback cuts above the root: keep the line visible
            ax.set_ylim(0, lam * 1.08)
        ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("merge distance")


def plot_dendrogram(clusters_json: dict[str, Any], path: str | Path) -> None:
    """The clustering-round dendrogram with the λ cut; leaves are "client·true group" in
    the group's colour. AdaCFL with several pre-clusters: one panel per pre-cluster."""
    truth = {k: int(v) for k, v in clusters_json.get("true_groups", {}).items()}
    panels: list[tuple[np.ndarray, list[str], float | None, str]] = []
    pre = [p for p in clusters_json.get("precluster_cuts") or [] if p.get("linkage")]
    if len(clusters_json.get("precluster_cuts") or []) > 1:
        for p in pre:
            panels.append((np.asarray(p["linkage"]), p["clients"], p.get("lambda"),
                           f"pre-cluster {p['precluster']} ({len(p['clients'])} clients)"))
        singles = [p for p in clusters_json["precluster_cuts"] if not p.get("linkage")]
        note = f" · {len(singles)} single-client pre-clusters not drawn" if singles else ""
    else:
        lam = clusters_json.get("lambda")
        panels.append((np.asarray(clusters_json["linkage"]), list(clusters_json["client_order"]),
                       lam if isinstance(lam, (int, float)) else None, "all clients"))
        note = ""
    width = max(7.0, min(18.0, 0.25 * max(len(k) for _, k, _, _ in panels) + 3))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.6 * len(panels)), squeeze=False)
    for ax, (Z, keys, lam, title) in zip(axes[:, 0], panels):
        _dendrogram_panel(ax, Z, keys, truth, lam, title)
    fig.suptitle(_title(clusters_json) + note, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cluster_accuracy(rounds: list[dict[str, Any]], path: str | Path) -> None:
    """Mean local test accuracy of each cluster's members per round (and over all clients),
    with a vertical line at the clustering round."""
    x = np.array([r["round"] for r in rounds])
    clusters = sorted({c for r in rounds for c in r.get("clusters", {})}, key=int)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    legend = len(clusters) <= 20
    for i, cluster in enumerate(clusters):
        ys = np.array([r.get("clusters", {}).get(cluster, {}).get("accuracy", np.nan) for r in rounds], dtype=float)
        size = next((r["clusters"][cluster]["size"] for r in reversed(rounds) if cluster in r.get("clusters", {})), 0)
        ax.plot(x, ys, lw=1.2, marker="." if len(x) <= 40 else None, color=_group_color(i, len(clusters)),
                label=f"cluster {cluster} ({size} client{'' if size == 1 else 's'})" if legend else None)
    mean = np.array([np.nan if r.get("accuracy") is None else r["accuracy"] for r in rounds], dtype=float)
    ax.plot(x, mean, color="black", lw=2, ls="--", label="all clients")
    for r in rounds:
        if "lambda_used" in r:
            ax.axvline(r["round"], color="grey", ls=":", lw=1)
            ax.text(r["round"], 0.02, " clustering", rotation=90, fontsize=7, color="grey", va="bottom")
        if r.get("newcomers_placed"):
            ax.axvline(r["round"], color="C3", ls=":", lw=1)
            ax.text(r["round"], 0.02, f" {r['newcomers_placed']} newcomers", rotation=90, fontsize=7, color="C3",
                    va="bottom")
    ax.set(xlabel="round", ylabel="local test accuracy of the cluster's members", ylim=(0, 1.02),
           title="accuracy per cluster")
    ax.grid(alpha=0.3)
    if len(clusters) > 6:  # many curves: keep the legend off them
        fig.set_size_inches(10.5, 4.5)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if len(clusters) <= 12 else 2)
    else:
        ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_clustering_figures(out_dir: str | Path) -> list[Path]:
    """Draw whichever clustering figures a results folder supports; returns the files."""
    out = Path(out_dir)
    written: list[Path] = []
    state_path = out / "clusters.json"
    if state_path.exists():
        state = json.loads(state_path.read_text())
        if len(state.get("client_order") or []) >= 2 and state.get("distance_matrix"):
            written.append(out / "distance_matrix.png")
            plot_distance_matrix(state, written[-1])
        if state.get("linkage"):
            written.append(out / "dendrogram.png")
            plot_dendrogram(state, written[-1])
    if (out / "rounds.jsonl").exists():
        rounds, _ = load_run(out)
        if any(len(r.get("clusters", {})) > 1 for r in rounds):
            written.append(out / "cluster_accuracy.png")
            plot_cluster_accuracy(rounds, written[-1])
    return written
