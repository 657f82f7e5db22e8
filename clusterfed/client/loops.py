"""The default training and evaluation loops of a ``ClientTask``: plain PyTorch over batches.

A batch is an ``(inputs, labels)`` pair (a ``TensorDataset``'s DataLoader) or a dict whose
``ClientTask.batch_keys`` name the inputs and labels (Flower Datasets' ``{"img", "label"}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from clusterfed.training import sgd


def loss_fn(task) -> Any:
    return task.loss_fn if task.loss_fn is not None else nn.CrossEntropyLoss()


def batches(task, loader: Iterable, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) of each batch of ``loader``, on ``device``."""
    if loader is None:
        raise ValueError("this split of the task's data is None")
    x_key, y_key = task.batch_keys
    for batch in loader:
        if isinstance(batch, Mapping):
            if x_key not in batch or y_key not in batch:
                raise ValueError(f"a batch has keys {sorted(batch)}; set ClientTask(batch_keys=(inputs, labels)) "
                                 f"(now {task.batch_keys})")
            x, y = batch[x_key], batch[y_key]
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            x, y = batch
        else:
            raise ValueError(f"a batch is a {type(batch).__name__}: the default loops take (inputs, labels) pairs "
                             "or dicts; give the ClientTask its own train_fn / evaluate_fn for other data")
        yield torch.as_tensor(x).to(device), torch.as_tensor(y).to(device)


def _number(config: Mapping, key: str, kind=float):
    if key not in config:
        raise ValueError(f"the message config has no {key!r} (the default training loop needs 'lr' and "
                         f"'local-epochs'); it has {sorted(config)}")
    return kind(config[key])


def default_train(task, model: nn.Module, data, config: Mapping, device: torch.device) -> float:
    """SGD (``lr``, ``momentum`` and ``weight-decay`` default 0) for ``local-epochs`` passes over
    ``data.train``; with ``proximal-mu`` > 0, FedProx's ``mu/2 * ||w - w_received||^2``. The
    mean training loss."""
    options = sgd_options(config)
    model.to(device)
    return sgd(model, lambda: batches(task, data.train, device), loss_fn=loss_fn(task), **options)


def sgd_options(config: Mapping) -> dict[str, Any]:
    """``sgd``'s keyword options from a message config (the default loop's keys)."""
    return {"epochs": _number(config, "local-epochs", int), "lr": _number(config, "lr"),
            "momentum": float(config.get("momentum", 0.0) or 0.0),
            "weight_decay": float(config.get("weight-decay", 0.0) or 0.0),
            "proximal_mu": float(config.get("proximal-mu", 0.0) or 0.0)}


@torch.no_grad()
def _mean_loss_and_accuracy(task, model: nn.Module, loader, device: torch.device) -> tuple[float, float, int]:
    model.to(device).eval()
    criterion = loss_fn(task)
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in batches(task, loader, device):
        outputs = model(x)
        loss_sum += float(criterion(outputs, y)) * len(y)
        if outputs.ndim == 2 and y.ndim == 1:
            correct += int((outputs.argmax(1) == y).sum())
        count += len(y)
    if count == 0:
        return 0.0, 0.0, 0
    return loss_sum / count, correct / count, count


def default_evaluate(task, model: nn.Module, data, config: Mapping, device: torch.device) -> dict[str, float]:
    """``eval-loss`` (the task's ``loss_fn``) and ``eval-accuracy`` (argmax) on ``data.test``."""
    if getattr(data, "test", None) is None:
        raise ValueError("evaluate needs test data: return TaskData(train, test) from data_fn")
    loss, accuracy, _ = _mean_loss_and_accuracy(task, model, data.test, device)
    return {"eval-loss": loss, "eval-accuracy": accuracy}


def default_train_loss(task, model: nn.Module, data, config: Mapping, device: torch.device) -> float:
    """The mean ``loss_fn`` over ``data.train`` (IFCA's choice)."""
    if task.train_fn is not None and task.loss_fn is None:
        raise ValueError("IFCA sends several models and the client keeps the one of lowest training loss: a task "
                         "with its own train_fn must give ClientTask the loss it trains (loss_fn) or a train_loss_fn")
    return _mean_loss_and_accuracy(task, model, data.train, device)[0]
