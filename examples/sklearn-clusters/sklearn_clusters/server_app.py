"""The ServerApp: FedClust (or CFL) over NumPy arrays. It imports neither torch nor
scikit-learn's model code: `pip install clusterfed` is all a server needs."""

from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from clusterfed import CFL, ClusteredResult, FedAvg, FedClust  # noqa: F401 (FedAvg, CFL: the lines below)
from sklearn_clusters.task import initial_arrays

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context):
    # strategy = FedAvg(fraction_train=1.0)                  # one model for every station
    strategy = FedClust(fraction_train=1.0)                  # one model per kind of site
    # alternative: split clusters while training (the stricter split test: see the README)
    # strategy = CFL(fraction_train=1.0, min_split_round=2, split_min_silhouette=0.6)
    return run(strategy, grid, context.run_config)


def run(strategy, grid: Grid, run_config) -> ClusteredResult:
    """Train with ``strategy``, print the per-round metrics and the clusters; return the result."""
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({name: Array(value) for name, value in initial_arrays().items()}),
        num_rounds=int(run_config["num-server-rounds"]),
        train_config=ConfigRecord({"local-epochs": int(run_config["local-epochs"])}),
    )
    print(f"\n{type(strategy).__name__}: per round, averaged over the stations by num-examples")
    print(result.summary("eval-loss", "eval-acc"))
    return result
