"""The ServerApp: Flower's quickstart with one line changed, FedAvg -> FedClust."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from clusterfed import CFL, ClusteredResult, FedAvg, FedClust  # noqa: F401 (FedAvg, CFL: the lines below)
from sensor_clusters.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context):
    # strategy = FedAvg(fraction_train=1.0)              # one model for every device
    strategy = FedClust(fraction_train=1.0)              # one model per group of similar devices
    # strategy = CFL(fraction_train=1.0, min_split_round=3)  # alternative: split clusters while training
    return run(strategy, grid, context.run_config)


def run(strategy, grid: Grid, run_config) -> ClusteredResult:
    """Train with ``strategy``, print the per-round metrics and the clusters; return the result."""
    torch.manual_seed(run_config.get("seed", 0))  # the same initial model for every strategy
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=int(run_config["num-server-rounds"]),
        train_config=ConfigRecord({"lr": float(run_config["learning-rate"]),
                                   "local-epochs": int(run_config["local-epochs"])}),
    )
    print(f"\n{type(strategy).__name__}: per round, averaged over the devices by num-examples")
    print(result.summary("train_loss", "eval_loss", "eval_acc"))
    return result
