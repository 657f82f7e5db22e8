"""Figures from a results folder (matplotlib, imported only when a figure is drawn).

``run``: accuracy band and traffic of one run; ``compare``: several strategies over seeds
(``clusterfed compare``);
``clustering``: distance matrix, dendrogram, per-cluster accuracy (one-shot strategies);
``splits``: split timeline, update norms, stability, similarity at each split
(bi-partitioning strategies).
"""

from clusterfed.plots.run import plot_run

__all__ = ["plot_run"]
