"""The users' stock ClientApp, written the way Flower's quickstart-pytorch writes one: it knows
nothing of clusterfed. The model, the shift, the epochs and the batch size come from the run
config (``[tool.flwr.app.config]`` under ``flwr run``); the learning rate from the message.
Training: SGD with momentum 0.9 on the cross-entropy (plus the model's auxiliary loss, for a
model that sets one); the reply carries the full state_dict (frozen arrays included),
``num-examples`` and the mean training loss.

``echo_app`` is a client that trains nothing and sends back exactly the arrays it received
(a round trip of every dtype and shape, 0-d buffers included)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.nn import functional as F

from model_matrix.data import load_data
from model_matrix.models import auxiliary_loss, build_model, data_kind

app = ClientApp()


def loaders(context: Context):
    model_name, run_config = str(context.run_config["model"]), context.run_config
    return load_data(data_kind(model_name), str(run_config["shift"]), int(context.node_config["partition-id"]),
                     batch_size=int(run_config["batch-size"]))


def train(model: nn.Module, loader, epochs: int, lr: float) -> float:
    """SGD with momentum 0.9 on the cross-entropy plus the model's auxiliary loss; the mean
    loss over the steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x).float(), y) + auxiliary_loss(model)
            loss.backward()
            optimizer.step()
            total, steps = total + float(loss.detach()), steps + 1
    return total / max(steps, 1)


@torch.no_grad()
def test(model: nn.Module, loader) -> tuple[float, float]:
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in loader:
        logits = model(x).float()
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    return loss / count, correct / count


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = build_model(str(context.run_config["model"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    train_loader, _ = loaders(context)
    loss = train(model, train_loader, int(context.run_config["local-epochs"]), float(msg.content["config"]["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(train_loader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    model = build_model(str(context.run_config["model"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, test_loader = loaders(context)
    loss, accuracy = test(model, test_loader)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(test_loader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


echo_app = ClientApp()


@echo_app.train()
def echo_train(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({"train_loss": 0.0, "num-examples": 1})
    return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg)


@echo_app.evaluate()
def echo_evaluate(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"eval_acc": 0.0, "num-examples": 1})}), reply_to=msg)
