"""Run the app in this Python process, without Ray or a SuperLink: the ServerApp's ``main``
on a grid whose 12 nodes call the ClientApp one after another.

    python run_inprocess.py            # the strategy in server_app.main (FedClust)
    python run_inprocess.py FedAvg     # or any clusterfed strategy, for comparison
    python run_inprocess.py CFL 10     # ... and a number of rounds other than num-server-rounds

Prints the per-round metrics, the clusters, and how well they match the kinds of site (ARI).
``clusterfed.simulation.inprocess_grid`` stands in for Flower's simulation engine; it is not part of the app.
"""

import sys
import time
import tomllib
from pathlib import Path

from flwr.app import Context, RecordDict
from sklearn.metrics import adjusted_rand_score

import clusterfed
from clusterfed.simulation import inprocess_grid
from sklearn_clusters.client_app import app as client_app
from sklearn_clusters.server_app import main, run
from sklearn_clusters.task import group_of

NUM_DEVICES = 12  # as options.num-supernodes in pyproject.toml


def simulate(strategy=None, rounds: int | None = None):
    """The ServerApp's ``main``, or ``run`` with ``strategy`` (a clusterfed class name or a
    strategy object); returns the result and the ARI."""
    run_config = tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    if rounds is not None:
        run_config["num-server-rounds"] = rounds
    grid = inprocess_grid(client_app, NUM_DEVICES,
                          node_configs=[{"partition-id": i, "num-partitions": NUM_DEVICES} for i in range(NUM_DEVICES)])
    if strategy is None:
        result = main(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config))
    else:
        strategy = getattr(clusterfed, strategy)(fraction_train=1.0) if isinstance(strategy, str) else strategy
        result = run(strategy, grid, run_config)
    # node i of this grid holds partition i; a stock ClientApp's client key is node-<node id>
    clusters = [result.assignment[f"node-{node}"] for node in grid.node_ids]
    return result, adjusted_rand_score([group_of(i) for i in range(NUM_DEVICES)], clusters)


if __name__ == "__main__":
    start = time.perf_counter()
    _, ari = simulate(*sys.argv[1:2], *map(int, sys.argv[2:3]))
    print(f"ARI against the kinds of site: {ari:.2f}   ({time.perf_counter() - start:.1f} s)")
