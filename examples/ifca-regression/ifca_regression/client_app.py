"""The ClientApp, made by clusterfed's client helper from the model and the data: the helper
speaks clusterfed's whole message contract, including IFCA's (the client receives all k
models, keeps the one with the lowest loss on its training data, trains it and says which).
Stock Flower ClientApps work with FedAvg, FedClust, CFL, ...; IFCA needs this helper."""

from flwr.app import Context
from torch import nn

from clusterfed.client import ClientTask, TaskData, client_app
from ifca_regression.task import group_of, linear_model, load_data, mse


def settings(context: Context, config: dict) -> dict:
    """The data set's settings: the run config (pyproject.toml) under `flwr run`; the ServerApp
    also sends them in each message's config, for runs without a run config (run_inprocess.py)."""
    return {**config, **context.run_config}


def model_fn(context: Context, config: dict) -> nn.Module:
    return linear_model(int(settings(context, config)["dimension"]))


def data_fn(context: Context, config: dict) -> TaskData:
    """This client's train and test data."""
    s, node = settings(context, config), context.node_config
    k = int(s["num-groups"])
    train, test = load_data(node["partition-id"], node["num-partitions"], k=k, d=int(s["dimension"]),
                            n=int(s["samples-per-client"]), r=float(s["separation"]), noise=float(s["noise"]),
                            batch_size=int(s["batch-size"]))
    # true_group is reported for the server's metrics only; nothing uses it to cluster
    return TaskData(train, test, true_group=group_of(node["partition-id"], node["num-partitions"], k))


task = ClientTask(
    model_fn=model_fn,
    data_fn=data_fn,
    loss_fn=nn.MSELoss(),  # the default training loop minimises it; IFCA's choice compares it too
    evaluate_fn=lambda model, data, config, device: {"eval-mse": mse(model, data.test)},
)

app = client_app(task)
