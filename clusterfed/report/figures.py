"""The report's figures as PNG bytes: the metric per cluster (``clusterfed.plots``' accuracy
band), loss per cluster, bytes each way per round, and cluster sizes over rounds."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from clusterfed.plots.run import MaxNLocator, plot_accuracy, plt  # matplotlib with the Agg backend

MAX_CLUSTER_CURVES = 20  # beyond this many clusters, per-cluster curves are unreadable
DPI = 100


def _png(fig) -> bytes:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return buffer.getvalue()


def _clusters(rounds: list[dict[str, Any]]) -> list[str]:
    return sorted({c for r in rounds for c in r.get("clusters", {})}, key=int)


def accuracy_png(rounds: list[dict[str, Any]], title: str, target: float | None, metric: str) -> bytes:
    buffer = io.BytesIO()
    plot_accuracy(rounds, buffer, title, target, metric)
    return buffer.getvalue()


def loss_png(rounds: list[dict[str, Any]], title: str) -> bytes:
    """Mean evaluation loss, the mean training loss, and each cluster's evaluation loss."""
    x = [r["round"] for r in rounds]
    nan = float("nan")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(x, [nan if r.get("loss") is None else r["loss"] for r in rounds], color="C0", lw=2,
            label="mean client test loss")
    if any(r.get("train_loss") is not None for r in rounds):
        ax.plot(x, [nan if r.get("train_loss") is None else r["train_loss"] for r in rounds], color="k", lw=1,
                ls=":", label="mean train loss")
    clusters = _clusters(rounds)
    if 1 < len(clusters) <= MAX_CLUSTER_CURVES:
        for i, cluster in enumerate(clusters):
            ys = [r.get("clusters", {}).get(cluster, {}).get("loss") for r in rounds]
            ax.plot(x, [nan if y is None else y for y in ys], lw=0.8, ls="--", color=f"C{(i + 1) % 10}",
                    label=f"cluster {cluster}")
    ax.set(xlabel="round", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def traffic_png(rounds: list[dict[str, Any]], title: str) -> bytes:
    """MB each way per round (bars) and cumulative (lines)."""
    x = np.array([r["round"] for r in rounds], dtype=float)
    up = np.array([r.get("bytes_up", 0) for r in rounds]) / 1e6
    down = np.array([r.get("bytes_down", 0) for r in rounds]) / 1e6
    fig, (per_round, total) = plt.subplots(1, 2, figsize=(7, 3.6))
    width = 0.4
    per_round.bar(x - width / 2, down, width, label="down (server → clients)", color="C1")
    per_round.bar(x + width / 2, up, width, label="up (clients → server)", color="C0")
    per_round.set(xlabel="round", ylabel="MB per round", title="per round")
    total.plot(x, np.cumsum(down), color="C1", label="down")
    total.plot(x, np.cumsum(up), color="C0", label="up")
    total.set(xlabel="round", ylabel="cumulative MB", title="cumulative")
    for ax in (per_round, total):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _png(fig)


def sizes_png(rounds: list[dict[str, Any]], title: str) -> bytes:
    """Clients per cluster per round, stacked (from the row's assignment, or the evaluated
    clients per cluster in rows written before the assignment was recorded)."""
    x = [r["round"] for r in rounds]
    counts: list[dict[str, int]] = []
    for r in rounds:
        if r.get("assignment"):
            per: dict[str, int] = {}
            for cluster in r["assignment"].values():
                per[str(cluster)] = per.get(str(cluster), 0) + 1
            counts.append(per)
        else:
            counts.append({c: int(v.get("size", 0)) for c, v in r.get("clusters", {}).items()})
    clusters = sorted({c for per in counts for c in per}, key=int)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    if clusters:
        ax.stackplot(x, [[per.get(c, 0) for per in counts] for c in clusters],
                     labels=[f"cluster {c}" for c in clusters],
                     colors=[f"C{i % 10}" for i in range(len(clusters))], alpha=0.85, step="mid")
    ax.set(xlabel="round", ylabel="clients", title=title)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if 0 < len(clusters) <= MAX_CLUSTER_CURVES:
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    return _png(fig)
