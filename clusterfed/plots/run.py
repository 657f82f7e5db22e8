"""Figures drawn from a results folder (rounds.jsonl, summary.json), so they can be redrawn."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from clusterfed.results import load_run  # noqa: E402


def plot_accuracy(rounds: list[dict], path: Path, title: str, target: float | None = None,
                  metric: str = "accuracy") -> None:
    """The declared metric's mean over clients (local test data) with a ± std band;
    per-cluster curves when there are clusters."""
    x = np.array([r["round"] for r in rounds])
    mean = np.array([np.nan if r.get(metric) is None else r[metric] for r in rounds])
    std = np.array([np.nan if r.get(f"{metric}_std") is None else r[f"{metric}_std"] for r in rounds])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, mean, color="C0", lw=2, label=f"mean client {metric}")
    ax.fill_between(x, mean - std, mean + std, color="C0", alpha=0.2, label="± std over clients")
    clusters = sorted({c for r in rounds for c in r.get("clusters", {})}, key=int)
    if 1 < len(clusters) <= 20:
        for i, cluster in enumerate(clusters):
            ys = [r.get("clusters", {}).get(cluster, {}).get(metric, np.nan) for r in rounds]
            ax.plot(x, ys, lw=0.8, ls="--", color=f"C{(i + 1) % 10}", label=f"cluster {cluster}")
    if target:
        ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.2f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="round", ylabel=f"local test {metric}", title=title)
    if metric == "accuracy":
        ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_traffic(rounds: list[dict], path: Path, title: str) -> None:
    """Cumulative MB sent down and up per round."""
    x = [r["round"] for r in rounds]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["cum_bytes_up"] / 1e6 for r in rounds], label="uplink (clients → server)")
    ax.plot(x, [r["cum_bytes_down"] / 1e6 for r in rounds], label="downlink (server → clients)")
    ax.set(xlabel="round", ylabel="cumulative MB", title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_run(out_dir: str | Path) -> list[Path]:
    """Draw every figure a results folder supports; returns the files written."""
    out = Path(out_dir)
    rounds, summary = load_run(out)
    if not rounds:
        return []
    config = summary.get("config", {})
    title = f"{config.get('strategy', '?')} · {config.get('dataset', '?')} / {config.get('partitioner', '?')}"
    written = [out / "accuracy.png", out / "traffic.png"]
    metric = summary.get("metric", "accuracy")
    plot_accuracy(rounds, written[0], title, summary.get(f"target_{metric}", config.get("target-accuracy")), metric)
    plot_traffic(rounds, written[1], title)
    # strategy figures draw only what their records hold (one-shot cuts, splits)
    from clusterfed.plots.clustering import plot_clustering_figures
    from clusterfed.plots.splits import plot_split_figures

    written += plot_clustering_figures(out)
    written += plot_split_figures(out)
    if any(r.get("p") is not None for r in rounds):  # a strategy that records a cluster count p per round
        from clusterfed.plots.selection import plot_cluster_count

        if plot_cluster_count(rounds, out / "cluster_count.png", title):
            written.append(out / "cluster_count.png")
    return written
