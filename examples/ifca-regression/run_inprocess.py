"""Run the app in this Python process, without Ray or a SuperLink: the ServerApp's ``main``
on a grid whose 16 nodes (pyproject's num-supernodes) call the ClientApp one after another.

    python run_inprocess.py            # the strategy in server_app.main (IFCA)
    python run_inprocess.py FedAvg     # or any clusterfed strategy with its defaults, for comparison
    python run_inprocess.py CFL 30     # ... and a number of rounds other than num-server-rounds

Prints the per-round MSE, the clusters, and how well they match the planted groups (ARI).
``clusterfed.simulation.run_app_inprocess`` stands in for Flower's simulation engine; it is not part of the app.
"""

from pathlib import Path

import torch
from ifca_regression.client_app import app as client_app
from ifca_regression.server_app import main, run
from ifca_regression.task import group_of

from clusterfed.simulation import run_app_inprocess, run_app_inprocess_main


def simulate(strategy=None, rounds: int | None = None):
    """The ServerApp's ``main``, or ``run`` with ``strategy`` (a clusterfed class name or a
    strategy object); returns the result and the ARI."""
    return run_app_inprocess(Path(__file__).parent, client_app, main, run,
                             lambda i, n, config: group_of(i, n, int(config["num-groups"])), strategy, rounds)


if __name__ == "__main__":
    torch.set_num_threads(1)  # a tiny model: more threads only contend
    run_app_inprocess_main(simulate, "the planted groups")
