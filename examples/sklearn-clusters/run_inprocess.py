"""Run the app in this Python process, without Ray or a SuperLink: the ServerApp's ``main``
on a grid whose 12 nodes (pyproject's num-supernodes) call the ClientApp one after another.

    python run_inprocess.py            # the strategy in server_app.main (FedClust)
    python run_inprocess.py FedAvg     # or any clusterfed strategy, for comparison
    python run_inprocess.py CFL 10     # ... and a number of rounds other than num-server-rounds

Prints the per-round metrics, the clusters, and how well they match the kinds of site (ARI).
``clusterfed.simulation.run_app_inprocess`` stands in for Flower's simulation engine; it is not part of the app.
"""

from pathlib import Path

from sklearn_clusters.client_app import app as client_app
from sklearn_clusters.server_app import main, run
from sklearn_clusters.task import group_of

from clusterfed.simulation import run_app_inprocess, run_app_inprocess_main


def simulate(strategy=None, rounds: int | None = None):
    """The ServerApp's ``main``, or ``run`` with ``strategy`` (a clusterfed class name or a
    strategy object); returns the result and the ARI."""
    return run_app_inprocess(Path(__file__).parent, client_app, main, run, lambda i, n, config: group_of(i),
                             strategy, rounds)


if __name__ == "__main__":
    run_app_inprocess_main(simulate, "the kinds of site")
