"""The ServerApp: IFCA with k cluster models on the mixture of linear regressions."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from clusterfed import CFL, IFCA, ClusteredResult, FedAvg  # noqa: F401 (FedAvg, CFL: the lines below)
from ifca_regression.task import linear_model

app = ServerApp()

# the keys the clients need to generate their data (sent with every message as well)
DATA_KEYS = ("num-groups", "dimension", "samples-per-client", "separation", "noise", "batch-size")


@app.main()
def main(grid: Grid, context: Context):
    k = int(context.run_config["num-groups"])
    # strategy = FedAvg(fraction_train=1.0)  # one model for everyone
    strategy = IFCA(num_clusters=k, init="kmeans++", restarts=5, fraction_train=1.0)  # k models
    # strategy = CFL(split_min_silhouette=0.6, fraction_train=1.0)  # no k needed: splits clusters in two
    # Why not IFCA's random start: the true weights share a large common part (entries 0 or R), so
    # k random models near zero are all beaten by the same one and k - 1 of them never get a client.
    # kmeans++ seeds the k models among the clients' models after a warm-up round (best of 5 seedings).
    return run(strategy, grid, context.run_config)


def run(strategy, grid: Grid, run_config) -> ClusteredResult:
    """Train with ``strategy``, print the per-round MSE and the clusters; return the result."""
    torch.manual_seed(int(run_config.get("seed", 0)))
    data = {key: run_config[key] for key in DATA_KEYS}
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(linear_model(int(run_config["dimension"])).state_dict()),
        num_rounds=int(run_config["num-server-rounds"]),
        train_config=ConfigRecord({"lr": float(run_config["learning-rate"]),
                                   "local-epochs": int(run_config["local-epochs"]), **data}),
        evaluate_config=ConfigRecord(data),
    )
    print(f"\n{type(strategy).__name__}: per round, averaged over the clients by num-examples"
          " (keys are partition ids)")
    print(result.summary("train-loss", "eval-mse"))
    return result
