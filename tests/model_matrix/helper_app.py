"""The same user task as ``client_app``, made into a ClientApp by clusterfed's client helper
(what IFCA and AdaCFL's label statistics need): the helper's default loop trains with the
message's ``lr``, ``local-epochs`` and ``momentum`` and reports ``eval-loss`` / ``eval-accuracy``;
the client is keyed by its partition id. A model with an auxiliary loss trains with the stock
client's loop instead (the default loop minimises ``loss_fn`` on the logits alone)."""

from __future__ import annotations

from flwr.app import Context
from torch.nn import functional as F

from clusterfed.client import ClientTask, TaskData, client_app
from clusterfed.client.loops import default_train
from model_matrix import client_app as stock
from model_matrix.data import group_of, load_data
from model_matrix.models import AuxDecoderClassifier, build_model, data_kind


def model_fn(context: Context, config: dict):
    return build_model(str(context.run_config["model"]))


def data_fn(context: Context, config: dict) -> TaskData:
    model_name, partition = str(context.run_config["model"]), int(context.node_config["partition-id"])
    train, test = load_data(data_kind(model_name), str(context.run_config["shift"]), partition,
                            batch_size=int(context.run_config["batch-size"]))
    labels = train.dataset.tensors[1].numpy()
    # true_group is for the server's metrics only; nothing clusters on it
    return TaskData(train, test, labels=labels, true_group=group_of(partition))


def float_loss(logits, labels):
    """Cross-entropy in float32 (a float16 model's logits are cast up)."""
    return F.cross_entropy(logits.float(), labels)


def train_fn(model, data: TaskData, config: dict, device) -> float:
    if isinstance(model, AuxDecoderClassifier):
        return stock.train(model, data.train, int(config["local-epochs"]), float(config["lr"]))
    return default_train(task, model, data, config, device)


task = ClientTask(model_fn=model_fn, data_fn=data_fn, train_fn=train_fn, loss_fn=float_loss)
app = client_app(task)
