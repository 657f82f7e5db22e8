"""Run the app in this Python process, without Ray or a SuperLink: the ServerApp's ``main``
on a grid whose 12 nodes call the ClientApp one after another.

    python run_inprocess.py            # the strategy in server_app.main (FedClust)
    python run_inprocess.py FedAvg     # or any clusterfed strategy, for comparison
    python run_inprocess.py CFL 15     # ... and a number of rounds other than num-server-rounds

Prints the per-round metrics, the clusters, and how well they match the product lines (ARI).
``InProcessGrid`` is clusterfed's test grid (clusterfed.runner.inprocess), not part of the app.
"""

import sys
import time
import tomllib
from pathlib import Path

import clusterfed
import torch
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from sklearn.metrics import adjusted_rand_score

from clusterfed.runner.inprocess import InProcessGrid
from sensor_clusters.client_app import app as client_app
from sensor_clusters.server_app import main, run
from sensor_clusters.task import group_of

NUM_DEVICES = 12

torch.set_num_threads(1)  # tiny model: more threads only contend
run_config = tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # what a SuperLink sets
grid = InProcessGrid(client_app, NUM_DEVICES,
                     node_configs=[{"partition-id": i, "num-partitions": NUM_DEVICES} for i in range(NUM_DEVICES)])
if len(sys.argv) > 2:
    run_config["num-server-rounds"] = int(sys.argv[2])
start = time.perf_counter()
if len(sys.argv) > 1:
    result = run(getattr(clusterfed, sys.argv[1])(fraction_train=1.0), grid, run_config)
else:
    result = main(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config))
# node i of this grid holds partition i, so its client key is f"node-{grid.node_ids[i]}"
clusters = [result.assignment[f"node-{node}"] for node in grid.node_ids]
groups = [group_of(i) for i in range(NUM_DEVICES)]
print(f"ARI against the product lines: {adjusted_rand_score(groups, clusters):.2f}   "
      f"({time.perf_counter() - start:.1f} s)")
