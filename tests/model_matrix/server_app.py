"""The users' ServerApp: one of clusterfed's strategies, chosen by the run config's
``strategy``, started the way Flower's strategies are (``strategy.start``)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from clusterfed import CFL, IFCA, AdaCFL, FedAvg, FedClust, HiCFL, LayerCFL
from model_matrix.models import build_model
from model_matrix.quickstart import MODEL_NAMES as QUICKSTART_MODELS

app = ServerApp()

# strategy name -> its construction from the number of groups (only IFCA is told it)
STRATEGIES = {
    "fedavg": lambda k: FedAvg(fraction_train=1.0),
    "fedclust": lambda k: FedClust(fraction_train=1.0),
    "adacfl": lambda k: AdaCFL(share_label_stats=False, fraction_train=1.0),
    "cfl": lambda k: CFL(fraction_train=1.0),
    "layercfl": lambda k: LayerCFL(fraction_train=1.0),
    "hicfl": lambda k: HiCFL(fraction_train=1.0),
    # these two need clusterfed's client helper (IFCA's choice among k models; label statistics)
    "ifca": lambda k: IFCA(num_clusters=k, init="kmeans++", restarts=5, fraction_train=1.0),
    "adacfl-helper": lambda k: AdaCFL(fraction_train=1.0),
}


def initial_model(name: str) -> torch.nn.Module:
    if name in QUICKSTART_MODELS:
        from model_matrix.quickstart.task import Net

        return Net()
    return build_model(name)


@app.main()
def main(grid: Grid, context: Context):
    strategy = STRATEGIES[str(context.run_config["strategy"])](int(context.run_config["num-groups"]))
    return run(strategy, grid, context.run_config)


def run(strategy, grid: Grid, run_config):
    """``strategy.start`` on the run config's model; returns Flower's Result (clusterfed's, with
    the clusters)."""
    torch.manual_seed(int(run_config.get("seed", 0)))
    model = initial_model(str(run_config["model"]))
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(run_config["num-server-rounds"]),
        # a stock client reads only lr; the helper's loop reads all three
        train_config=ConfigRecord({"lr": float(run_config["learning-rate"]),
                                   "local-epochs": int(run_config["local-epochs"]), "momentum": 0.9}),
    )
