"""Run the app in this Python process, without Ray or a SuperLink: the ServerApp's ``main``
on a grid whose 16 nodes call the ClientApp one after another.

    python run_inprocess.py            # the strategy in server_app.main (IFCA)
    python run_inprocess.py FedAvg     # or any clusterfed strategy with its defaults, for comparison
    python run_inprocess.py CFL 30     # ... and a number of rounds other than num-server-rounds

Prints the per-round MSE, the clusters, and how well they match the planted groups (ARI).
``clusterfed.simulation.inprocess_grid`` stands in for Flower's simulation engine; it is not part of the app.
"""

import sys
import time
import tomllib
from pathlib import Path

import torch
from flwr.app import Context, RecordDict
from sklearn.metrics import adjusted_rand_score

import clusterfed
from clusterfed.simulation import inprocess_grid
from ifca_regression.client_app import app as client_app
from ifca_regression.server_app import main, run
from ifca_regression.task import group_of

NUM_CLIENTS = 16  # as options.num-supernodes in pyproject.toml


def simulate(strategy=None, rounds: int | None = None):
    """The ServerApp's ``main``, or ``run`` with ``strategy`` (a clusterfed class name or a
    strategy object); returns the result and the ARI."""
    run_config = tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    if rounds is not None:
        run_config["num-server-rounds"] = rounds
    grid = inprocess_grid(client_app, NUM_CLIENTS,
                         node_configs=[{"partition-id": i, "num-partitions": NUM_CLIENTS} for i in range(NUM_CLIENTS)])
    if strategy is None:
        result = main(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config))
    else:
        strategy = getattr(clusterfed, strategy)(fraction_train=1.0) if isinstance(strategy, str) else strategy
        result = run(strategy, grid, run_config)
    # the client helper keys each client by its partition id
    clusters = [result.assignment[str(i)] for i in range(NUM_CLIENTS)]
    groups = [group_of(i, NUM_CLIENTS, int(run_config["num-groups"])) for i in range(NUM_CLIENTS)]
    return result, adjusted_rand_score(groups, clusters)


if __name__ == "__main__":
    torch.set_num_threads(1)  # a tiny model: more threads only contend
    start = time.perf_counter()
    _, ari = simulate(*sys.argv[1:2], *map(int, sys.argv[2:3]))
    print(f"ARI against the planted groups: {ari:.2f}   ({time.perf_counter() - start:.1f} s)")
