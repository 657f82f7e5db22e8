"""The client helper: your model, data and (optionally) training/evaluation as a ClientApp that
speaks clusterfed's full message contract (partial upload, updates, IFCA's choice among K
models, label statistics, the profile query with a stable client key, the warm worker).

A quickstart-style ``client_app.py`` (``Net`` and ``load_data`` are the user's own, as in
Flower's quickstart-pytorch)::

    from clusterfed.client import ClientTask, TaskData, client_app
    from pytorchexample.task import Net, load_data

    def data_fn(context, config):  # the Flower Context and the message's config
        node = context.node_config
        trainloader, testloader = load_data(node["partition-id"], node["num-partitions"],
                                            context.run_config["batch-size"])
        return TaskData(trainloader, testloader)  # TaskData(..., labels=y_train): label statistics

    task = ClientTask(
        model_fn=lambda context, config: Net(),
        data_fn=data_fn,
        # train_fn / evaluate_fn: default plain PyTorch loops (SGD with the message's lr,
        # local-epochs and momentum, FedProx's term when proximal-mu > 0; eval-loss and
        # eval-accuracy). Your own, e.g. for regression:
        # evaluate_fn=lambda model, data, config, device: {"eval-mse": mse(model, data.test)}
    )
    app = client_app(task)  # pyproject.toml: clientapp = "pytorchexample.client_app:app"

Tell the helper which strategy the server runs and a task that cannot serve it is refused
when the app is built, not in round 1: ``client_app(task, requires=IFCA().requires())`` (IFCA
sends K models and the client keeps the one of lowest training loss: a task with its own
``train_fn`` must then give ``loss_fn`` or ``train_loss_fn``). Without it, the profile tells
the server what the task can do. ``client_app(task, secure_aggregation=True)`` adds
``clusterfed.secagg.secagg_mod`` (SecAgg+ within each cluster) and changes nothing else.

A stock Flower ClientApp (not built with this helper) keeps FedClust's and AdaCFL's clustering
upload small with one mod, ``ClientApp(mods=[clusterfed.client.evidence_mod])``: it projects
the clustering round's reply as the server asks (``clusterfed.client.mods``).

On a device, where Flower starts one process per message, name the task by its import path in
a ClientApp module that imports only ``clusterfed.client``::

    app = client_app("pytorchexample.client_app:task")  # imported in the warm worker, not here

Each message is then handed to a warm worker that imports the task once and keeps it, torch and
the data loaded (node config ``warm-worker``). The built-in image task is
``clusterfed.client_app.TASK``; its ClientApps are ``clusterfed.client_app.app`` (in process) and
``clusterfed.client_entry.app`` (by import path: a warm worker on a device).
"""

from clusterfed.client.app import CHOICE, CHOICES, client_app, reply, uses_warm_worker
from clusterfed.client.identity import client_key
from clusterfed.client.mods import evidence_mod
from clusterfed.client.task import ClientTask, TaskCapabilityError, TaskData, load_task

__all__ = ["CHOICE", "CHOICES", "ClientTask", "TaskCapabilityError", "TaskData", "client_app", "client_key",
           "evidence_mod", "load_task", "reply", "uses_warm_worker"]
