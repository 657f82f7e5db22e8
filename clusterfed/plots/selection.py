"""Adaptive cluster-count client selection: the number of clusters p (= clients trained)
over rounds, beside the mean participant training loss."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def plot_cluster_count(rounds: list[dict], path: Path, title: str) -> bool:
    """p per round (warm-up rounds, which train everyone, drawn as the client count) on
    the left, the mean training loss on the right; False when the records hold no p."""
    if not any(r.get("p") is not None for r in rounds):
        return False
    x = [r["round"] for r in rounds]
    trained = [r.get("trained_clients") for r in rounds]
    p = [r.get("p") for r in rounds]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.step(x, [t if v is None else v for v, t in zip(p, trained)], where="mid", color="C0", label="p (clusters)")
    warm = [(xi, t) for xi, v, t in zip(x, p, trained) if v is None]
    if warm:
        left.scatter(*zip(*warm), color="C3", s=12, zorder=3, label="warm-up (all clients)")
    left.set(xlabel="round", ylabel="clients trained", title=title)
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.plot(x, [r.get("train_loss") for r in rounds], color="C1")
    right.set(xlabel="round", ylabel="mean participant training loss", title="loss")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
