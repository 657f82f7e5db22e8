"""The random-model harness (``benchmarks/model_fuzz.py``): cells drawn at random — a model
written as an outside user writes it, its data and shift, its federation — run against every
registered strategy with its defaults and stock Flower-style ClientApps.

- ``cell``: ``Cell`` and ``draw_cell(seed)`` (same seed, same cell);
- ``models``: the cell's PyTorch model (MLP, CNN, ResNet-style, attention, recurrent, multi-head);
- ``data``: the cell's clients' data (MNIST or scikit-learn's digits) and true groups;
- ``apps``: the users' stock ClientApp, and the same task through ``clusterfed.client``;
- ``run``: one cell against the strategies, scored (accuracy, ARI, bytes, time) and judged;
- ``report``: the per-strategy table (markdown, CSV, JSON) and the heatmap.
"""
