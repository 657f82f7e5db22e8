"""Figures of ``clusterfed compare``: all strategies on one plot, mean over seeds ± std."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _stack(runs: list[list[dict]], key) -> np.ndarray:
    """seeds × rounds (the shortest run's length), NaN where a round has no accuracy."""
    length = min(len(r) for r in runs)
    return np.array([[np.nan if key(row) is None else key(row) for row in run[:length]] for run in runs], dtype=float)


def _band(ax, x: np.ndarray, values: np.ndarray, color: str, label: str) -> None:
    mean = np.nanmean(values, axis=0)
    std = np.nanstd(values, axis=0)
    ax.plot(x, mean, color=color, lw=1.6, label=label)
    if len(values) > 1:
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, lw=0)


def plot_compare(runs: dict[str, list[list[dict]]], out: Path, title: str) -> list[Path]:
    """``accuracy_vs_round.png`` and ``accuracy_vs_mb.png`` from each strategy's runs (one
    list of rounds.jsonl rows per seed). On the MB plot x is the mean cumulative MB
    (up + down) over seeds at each round."""
    written = [out / "accuracy_vs_round.png", out / "accuracy_vs_mb.png"]
    figures = [plt.subplots(figsize=(7.5, 4.5)) for _ in written]
    for i, (strategy, seeds) in enumerate(runs.items()):
        if not seeds or not min(len(r) for r in seeds):
            continue
        color = f"C{i % 10}" if i < 10 else plt.cm.tab20((i - 10) / 10)
        accuracy = _stack(seeds, lambda r: r["accuracy"])
        rounds = _stack(seeds, lambda r: r["round"])[0]
        mb = np.nanmean(_stack(seeds, lambda r: (r["cum_bytes_up"] + r["cum_bytes_down"]) / 1e6), axis=0)
        _band(figures[0][1], rounds, accuracy, color, strategy)
        _band(figures[1][1], mb, accuracy, color, strategy)
    seeds_note = f" (mean ± std over {max((len(s) for s in runs.values()), default=0)} seeds)"
    figures[0][1].set(xlabel="round", ylabel="mean local test accuracy", title=title + seeds_note)
    figures[0][1].xaxis.set_major_locator(MaxNLocator(integer=True))
    figures[1][1].set(xlabel="cumulative MB (up + down)", ylabel="mean local test accuracy", title=title + seeds_note)
    for (fig, ax), path in zip(figures, written):
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return written
