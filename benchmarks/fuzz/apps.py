"""The users' ClientApps for a fuzz cell (the cell travels as JSON in the run config's ``cell``).

``stock_app`` is written the way Flower's quickstart-pytorch writes a ClientApp: it knows
nothing of clusterfed, reads ``lr`` from the message's config and its epochs from the run
config, trains with the optimizer the user picked (the cell's), and replies with the full
state_dict, ``num-examples`` and the training loss. ``helper_app`` is the same task made into
a ClientApp by ``clusterfed.client`` (for a strategy whose ``requires()`` names a capability a
stock client lacks: IFCA's choice among models, label statistics): the user's own ``train_fn``
(the same loop; it honours the message's ``local-epochs`` when the server sends one) and
``loss_fn`` (cross-entropy), the training labels for the statistics."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.nn import functional as F

from clusterfed.client import ClientTask, TaskData, client_app
from fuzz.cell import Cell
from fuzz.data import client_arrays, loaders, true_groups
from fuzz.models import build_model


def cell_of(context: Context) -> Cell:
    return Cell.from_json(str(context.run_config["cell"]))


def make_optimizer(cell: Cell, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    parameters = model.parameters()
    if cell.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=lr)
    if cell.optimizer == "sgd_momentum":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9)
    if cell.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=0.01)


def train(cell: Cell, model: torch.nn.Module, loader, epochs: int, lr: float) -> float:
    """The user's loop: cross-entropy plus the auxiliary heads' loss; the mean loss over the steps."""
    optimizer = make_optimizer(cell, model, lr)
    model.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y) + model.extra_loss(y)
            loss.backward()
            optimizer.step()
            total, steps = total + float(loss.detach()), steps + 1
    return total / max(steps, 1)


@torch.no_grad()
def test(model: torch.nn.Module, loader) -> tuple[float, float]:
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in loader:
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    return loss / count, correct / count


stock_app = ClientApp()


@stock_app.train()
def stock_train(msg: Message, context: Context) -> Message:
    cell = cell_of(context)
    model = build_model(cell)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    train_loader, _ = loaders(cell, int(context.node_config["partition-id"]))
    loss = train(cell, model, train_loader, int(context.run_config["local-epochs"]), float(msg.content["config"]["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(train_loader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@stock_app.evaluate()
def stock_evaluate(msg: Message, context: Context) -> Message:
    cell = cell_of(context)
    model = build_model(cell)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, test_loader = loaders(cell, int(context.node_config["partition-id"]))
    loss, accuracy = test(model, test_loader)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(test_loader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def model_fn(context: Context, config: dict):
    return build_model(cell_of(context))


def data_fn(context: Context, config: dict) -> TaskData:
    cell, partition = cell_of(context), int(context.node_config["partition-id"])
    train_loader, test_loader = loaders(cell, partition)
    labels = client_arrays(cell.to_json(), partition)[1]
    # true_group is for the server's metrics only; nothing clusters on it
    return TaskData(train_loader, test_loader, labels=labels, true_group=true_groups(cell)[partition])


def train_fn(model, data: TaskData, config: dict, device) -> float:
    """The user's loop for the helper, with the message's ``local-epochs`` where it sends one."""
    cell = model.cell
    return train(cell, model, data.train, int(config.get("local-epochs", cell.local_epochs)), float(config["lr"]))


task = ClientTask(model_fn=model_fn, data_fn=data_fn, train_fn=train_fn,
                  loss_fn=lambda logits, labels: F.cross_entropy(logits, labels))
helper_app = client_app(task)
